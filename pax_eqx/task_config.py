"""TaskConfig: what a Task adds to its model and learner (Pax's SingleTask hyperparameters).

losses / loss_weights: the loss aggregator (Pax's LossAggregator). The training objective is
  sum_i loss_weights[i] * metrics[losses[i]].value + the aux losses the layers added. Empty
  `losses` means the model's own `loss_name` with weight 1.
aux_loss_weight: scales the sum of the layers' aux losses (`Context.add_aux_loss`).
variational_noise: Pax's `vn`: Gaussian noise on the weights in the training forward pass.
"""

from __future__ import annotations

from pax_eqx.config import Config, ConfigError, check_range, config


@config
class VariationalNoiseConfig(Config):
    """scale: the noise's standard deviation (0 = off); start_step: the first step it is added.

    Fresh noise every step, drawn from the train state's key (so a resumed run draws the same
    noise); the same noise for every microbatch of a step; never in eval or decode.
    """

    scale: float = 0.0
    start_step: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        check_range(self, "scale", ge=0, prefix="task.variational_noise", note="0 = off")
        check_range(self, "start_step", ge=0, prefix="task.variational_noise")
        if self.scale == 0.0 and self.start_step != 0:
            raise ConfigError(
                f"task.variational_noise.start_step={self.start_step} has no effect with scale=0; "
                "set task.variational_noise.scale > 0 to add noise."
            )


@config
class TaskConfig(Config):
    """How the model's losses make the training objective (Pax's LossAggregator).

    losses: the names of the model's loss metrics the objective sums (empty = the model's own
      loss, weight 1).
    loss_weights: one weight per entry of `losses` (empty = 1 each).
    aux_loss_weight: scales the sum of the layers' aux losses (MoE load balancing); 0 = off.
    variational_noise: Gaussian weight noise in the training forward (Pax's `vn`).
    """

    losses: tuple[str, ...] = ()
    loss_weights: tuple[float, ...] = ()
    aux_loss_weight: float = 1.0
    variational_noise: VariationalNoiseConfig = VariationalNoiseConfig()

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix (variational_noise checks itself)."""
        check_range(self, "loss_weights", ge=0, prefix="task")
        check_range(self, "aux_loss_weight", ge=0, prefix="task", note="0 = aux losses off")
        if self.loss_weights and len(self.loss_weights) != len(self.losses):
            raise ConfigError(
                f"task.loss_weights={list(self.loss_weights)} needs one weight per loss in task.losses="
                f"{list(self.losses)}; give {len(self.losses)} weights, or none for weight 1 each."
            )
        if len(set(self.losses)) != len(self.losses):
            raise ConfigError(f"task.losses={list(self.losses)} names a loss twice.")

    def loss_terms(self, default: str) -> tuple[tuple[str, float], ...]:
        """(metric name, weight) pairs of the objective; the model's `default` loss when none."""
        names = self.losses or (default,)
        return tuple(zip(names, self.loss_weights or (1.0,) * len(names)))
