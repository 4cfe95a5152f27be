"""Early stopping on an eval metric (Pax's EarlyStoppingFn), and its state across restarts.

After each eval the loop hands the metrics to `EarlyStopping.update`; a reason back means stop:
the loop saves a checkpoint, prints the reason and exits 0.

Where the state lives: in the checkpoint, beside the input positions (the data item's JSON,
covered by the manifest's checksums): the best value, its step, the evals since, and -- once
stopped -- the reason. So a restarted run counts patience from exactly the state of the step it
resumes, and a run that stopped early stays stopped when the command is rerun.
Rejected: recomputing it from metrics.jsonl. That file is process 0's alone (other hosts would
need it broadcast), it keeps the lines a killed run wrote past its last checkpoint (the replay
would have to cut at the restored step and take the last line of each), and it may be deleted
or rotated by a user while the checkpoint is the record the run restores from anyway.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from pax_eqx.config import ConfigError
from pax_eqx.experiment import EarlyStoppingConfig
from pax_eqx.summaries.scalars import with_loss_alias

STATE_KEY = "early_stopping"


@dataclass
class EarlyStopping:
    cfg: EarlyStoppingConfig
    best: float | None = None
    best_step: int = -1
    evals_since_best: int = 0
    stopped: str = ""  # the reason, once the run has stopped early

    @property
    def enabled(self) -> bool:
        return bool(self.cfg.metric)

    def update(self, step: int, metrics: dict[str, float]) -> str:
        """The reason to stop after the eval at `step` ("" = go on)."""
        if not self.enabled:
            return ""
        name = self.cfg.metric
        metrics = with_loss_alias(metrics)
        self.check_metric(metrics)
        value = float(metrics[name])
        sign = 1.0 if self.cfg.mode == "min" else -1.0
        if self.best is None or (math.isfinite(value) and sign * (self.best - value) > self.cfg.min_delta):
            self.best, self.best_step, self.evals_since_best = value, step, 0
        else:
            self.evals_since_best += 1
        reached = "<=" if self.cfg.mode == "min" else ">="
        if self.cfg.target and sign * (value - self.cfg.target) <= 0:
            self.stopped = f"eval {name} {value:.6g} reached the target {reached} {self.cfg.target:g}"
        elif self.cfg.patience and self.evals_since_best >= self.cfg.patience:
            delta = f" by more than {self.cfg.min_delta:g}" if self.cfg.min_delta else ""
            self.stopped = (
                f"eval {name} has not improved{delta} for {self.evals_since_best} evals (patience "
                f"{self.cfg.patience}; best {self.best:.6g} at step {self.best_step}, now {value:.6g})"
            )
        return self.stopped

    def check_metric(self, names: Any) -> None:
        """ConfigError unless the watched metric is one of `names` (the eval's metrics)."""
        if self.enabled and self.cfg.metric not in names:
            raise ConfigError(
                f"train.early_stopping.metric={self.cfg.metric!r} is not among the eval metrics {sorted(names)}; name "
                "one of them."
            )

    def state(self) -> dict[str, Any]:
        """What the checkpoint keeps (JSON)."""
        return {k: v for k, v in asdict(self).items() if k != "cfg"}

    @classmethod
    def restore(cls, cfg: EarlyStoppingConfig, data_state: dict[str, Any] | None) -> EarlyStopping:
        """From a checkpoint's data state (fresh if it holds none, or if it watched another metric or
        mode: its best value would mean something else)."""
        saved = (data_state or {}).get(STATE_KEY)
        if (
            not cfg.metric
            or not saved
            or (saved["config"]["metric"], saved["config"]["mode"]) != (cfg.metric, cfg.mode)
        ):
            return cls(cfg)
        # A run stopped early stays stopped under the same rule; a changed rule (more patience, another
        # target) decides again at the next eval.
        stopped = saved["stopped"] if saved["config"] == cfg.to_dict() else ""
        return cls(cfg, saved["best"], saved["best_step"], saved["evals_since_best"], stopped)

    def saved(self) -> dict[str, Any]:
        """What the checkpoint keeps (JSON): the state and the rule it was counted under."""
        return {**self.state(), "config": self.cfg.to_dict()}

    def riders(self) -> dict[str, Any]:
        """Its entry in a checkpoint's data state (input_positions.input_states), when it is on."""
        return {STATE_KEY: self.saved()} if self.enabled else {}
