"""CheckpointConfig: when to save, how many to keep, and whether a resume may change the config."""

from __future__ import annotations

import re

from pax_eqx.config import Config, ConfigError, check_range, config


@config
class InitFromCheckpointConfig(Config):
    """Pax's `init_from_checkpoint_rules` for one source: when a run starts from scratch, copy the
    parameters these rules name from another job dir's newest checkpoint (a pax_eqx job dir,
    e.g. one `python -m pax_eqx.import_pax` wrote from a Paxml checkpoint).

    job_dir: the source job dir (its config.json describes its model; its checkpoints/ are read,
        read-only).
    rules: (regex on our parameter name, the source parameter's name) pairs, Pax's load_rules:
        each of our parameters takes the first rule whose regex matches it whole (re.fullmatch);
        the source name is a format string given the regex's groups, e.g.
        (r"stack\\.layers\\.(\\d+)\\.attention\\.(.*)", "stack.layers.{0}.attention.{1}").
        Parameters that no rule names keep their initialisation.
    step: the source checkpoint's step (-1 = its newest).
    """

    job_dir: str = ""
    rules: tuple[tuple[str, str], ...] = ()
    step: int = -1

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        where = "checkpoint.init_from_checkpoint_rules"
        if not isinstance(self.job_dir, str) or not self.job_dir:
            raise ConfigError(f"{where}: job_dir={self.job_dir!r} must name the source job dir.")
        if not self.rules:
            raise ConfigError(f"{where}: rules for {self.job_dir!r} are empty; give (regex, source name) pairs.")
        for rule in self.rules:
            if not (isinstance(rule, (tuple, list)) and len(rule) == 2 and all(isinstance(r, str) for r in rule)):
                raise ConfigError(f"{where}: rule {rule!r} must be a (regex on our name, source name) pair of strings.")
            try:
                re.compile(rule[0])
            except re.error as e:
                raise ConfigError(f"{where}: rule {rule!r}: {rule[0]!r} is not a valid regex ({e}).") from None
        check_range(self, "step", ge=-1, prefix=where, note="-1 = the newest")


@config
class CheckpointConfig(Config):
    """every_n_steps: save after every N-th training step (0 = off; the last step is always saved).
    max_to_keep: keep the newest N committed checkpoints, delete older ones (0 = keep all).
    every_n_seconds: also save when this many seconds have passed since the last save (0 = off);
        with several hosts, process 0's clock decides for all of them.
    async_save: write in a background thread; training continues once the arrays are on the host.
    allow_config_change: resume a job dir whose saved config.json differs in the model or data
        (the trainer refuses otherwise, with the list of changed fields).
    init_from_checkpoint_rules: `InitFromCheckpointConfig`s (Pax's init_from_checkpoint_rules):
        parameters copied from other job dirs' checkpoints when the run starts from scratch
        (a resumed run restores its own checkpoint instead).
    """

    every_n_steps: int = 1000
    max_to_keep: int = 3
    every_n_seconds: float = 0.0
    async_save: bool = True
    allow_config_change: bool = False
    init_from_checkpoint_rules: tuple[InitFromCheckpointConfig, ...] = ()

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Raises ConfigError naming the field, the value and the fix."""
        check_range(self, ("every_n_steps", "every_n_seconds"), ge=0, prefix="checkpoint", note="0 turns it off")
        check_range(self, "max_to_keep", ge=0, prefix="checkpoint", note="0 = keep all")
        for source in self.init_from_checkpoint_rules:
            if not isinstance(source, InitFromCheckpointConfig):
                raise ConfigError(
                    f"checkpoint.init_from_checkpoint_rules holds {source!r}, not an "
                    "InitFromCheckpointConfig(job_dir=..., rules=...)."
                )
            source.validate()
