"""CheckpointConfig: when to save, how many to keep, and whether a resume may change the config."""

from __future__ import annotations

from pax_eqx.config import Config, check_range, config


@config
class CheckpointConfig(Config):
    """every_n_steps: save after every N-th training step (0 = off; the last step is always saved).
    max_to_keep: keep the newest N committed checkpoints, delete older ones (0 = keep all).
    every_n_seconds: also save when this many seconds have passed since the last save (0 = off);
        with several hosts, process 0's clock decides for all of them.
    async_save: write in a background thread; training continues once the arrays are on the host.
    allow_config_change: resume a job dir whose saved config.json differs in the model or data
        (the trainer refuses otherwise, with the list of changed fields).
    """

    every_n_steps: int = 1000
    max_to_keep: int = 3
    every_n_seconds: float = 0.0
    async_save: bool = True
    allow_config_change: bool = False

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        check_range(self, ("every_n_steps", "every_n_seconds"), ge=0, prefix="checkpoint", note="0 turns it off")
        check_range(self, "max_to_keep", ge=0, prefix="checkpoint", note="0 = keep all")
