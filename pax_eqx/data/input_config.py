"""InputConfig: Pax's `BaseInput.HParams` -- batch size, host sharding, seed and the eval table.

Pax's reset_for_eval x eval_loop_num_batches table (data-inputs seed), enforced by `validate`
when the experiment is built, never mid-run:

|                      | N static (`eval_loop_num_batches=N > 0`)   | N dynamic (`0` or `-1`)              |
|----------------------|--------------------------------------------|--------------------------------------|
| reset_for_eval=True  | not supported (as in Pax): error           | one epoch per eval run; the input    |
|                      |                                            | must be finite (`repeat=False`) and  |
|                      |                                            | every host raises StopIteration      |
|                      |                                            | after the same number of batches     |
| reset_for_eval=False | each eval run reads the next N batches of  | not supported: error                 |
|                      | an input that repeats forever              |                                      |
|                      | (`repeat=True`), rolling, non-overlapping  |                                      |

Training inputs must repeat (the train loop reads `num_steps` batches and never resets).
"""

from __future__ import annotations

from typing import Literal

from pax_eqx.config import SEED_MAX, Config, ConfigError, check_range, config

Split = Literal["train", "eval"]


@config
class InputConfig(Config):
    """batch_size: examples per host per batch (global batch = batch_size x num_infeed_hosts).
    num_infeed_hosts: how many hosts share the data (0 = jax.process_count()).
    infeed_host_index: this host's shard (-1 = jax.process_index()).
    input_random_seed: seeds shuffling and random windows; the iterator state in checkpoints
        makes a resumed run see exactly the batches an uninterrupted run would.
    shuffle: shuffle examples (a fresh order every epoch).
    repeat: repeat forever (training; rolling eval); False = one finite epoch.
    reset_for_eval: restart the input at every eval run (see the table in the module doc).
    eval_loop_num_batches: N batches per eval run; 0 or -1 = until StopIteration (one epoch).
    num_workers: grain worker processes producing batches (0 = in this process; workers help
        only when preprocessing is heavy, and need the data source to be picklable).
    metrics: what the eval split is also scored with (SeqIO's metric_fns: the input names how it
      is judged; pax_eqx.metric_fns): on the model's per-example outputs "confusion_matrix"
      (writes DIR/plots/confusion.png and confusion.json), "balanced_accuracy" (a classifier),
      "bits_per_byte" (a language model); on decoded outputs against the targets (a
      sequence-to-sequence model) "exact_match", "bleu", "chrf", "rouge", or a dotted path
      package.module.function to your own fn(targets, predictions) -> {name: float}. Eval only.
    read_threads: threads reading and transforming examples ahead (grain ReadOptions; 0 = in the
        calling thread, best for in-memory data).
    """

    batch_size: int = 12
    num_infeed_hosts: int = 0
    infeed_host_index: int = -1
    input_random_seed: int = 1234
    shuffle: bool = True
    repeat: bool = True
    reset_for_eval: bool = False
    eval_loop_num_batches: int = 0
    num_workers: int = 0
    read_threads: int = 0
    metrics: tuple[str, ...] = ()

    def validate(self, split: Split, where: str = "") -> None:
        """Raises ConfigError for bad values and for the table's unsupported cells."""
        at = where or f"data.{split}"
        if self.metrics and split != "eval":
            raise ConfigError(
                f"{at}.metrics={list(self.metrics)}: only the eval split is scored; set data.eval.metrics instead."
            )
        if len(set(self.metrics)) != len(self.metrics):
            raise ConfigError(f"{at}.metrics={list(self.metrics)} names a metric twice.")
        check_range(self, "batch_size", gt=0, prefix=at)
        check_range(self, "num_infeed_hosts", ge=0, prefix=at, note="0 = one per JAX process")
        if self.infeed_host_index < -1:
            raise ConfigError(
                f"{at}.infeed_host_index must be >= 0, or -1 for jax.process_index(); got {self.infeed_host_index}."
            )
        check_range(self, "infeed_host_index", ge=-1, prefix=at, note="-1 = jax.process_index()")
        check_range(self, "input_random_seed", ge=0, le=SEED_MAX, prefix=at)
        if self.num_workers < 0 or self.read_threads < 0:
            raise ConfigError(
                f"{at}.num_workers={self.num_workers} and {at}.read_threads={self.read_threads} must be >= 0."
            )
        check_range(self, ("num_workers", "read_threads"), ge=0, prefix=at, note="0 = in this process")
        if self.eval_loop_num_batches < -1:
            raise ConfigError(
                f"{at}.eval_loop_num_batches={self.eval_loop_num_batches}: use N > 0 for N batches per eval run, "
                "or 0 / -1 to read until the input is exhausted."
            )
        check_range(self, "eval_loop_num_batches", ge=-1, prefix=at, note="0 or -1 = until the input is exhausted")
        if self.num_infeed_hosts and self.infeed_host_index >= self.num_infeed_hosts:
            raise ConfigError(
                f"{at}.infeed_host_index={self.infeed_host_index} is out of range for "
                f"{at}.num_infeed_hosts={self.num_infeed_hosts}; use 0..{self.num_infeed_hosts - 1}."
            )
        if split == "train":
            if not self.repeat:
                raise ConfigError(
                    f"{at}.repeat=False: training reads train.num_steps batches and never resets its input, so a "
                    f"finite training input would end mid-run; set {at}.repeat=True."
                )
            if self.reset_for_eval:
                raise ConfigError(
                    f"{at}.reset_for_eval=True: reset_for_eval applies to eval inputs only (Pax never resets "
                    f"training data); set {at}.reset_for_eval=False."
                )
            return
        static = self.eval_loop_num_batches > 0
        if self.reset_for_eval and static:
            raise ConfigError(
                f"{at}.reset_for_eval=True with {at}.eval_loop_num_batches={self.eval_loop_num_batches} is not "
                "supported (as in Pax): either evaluate one full epoch each run "
                f"({at}.eval_loop_num_batches=0, {at}.repeat=False), or roll over N new batches each run "
                f"({at}.reset_for_eval=False, {at}.repeat=True)."
            )
        if self.reset_for_eval and self.repeat:
            raise ConfigError(
                f"{at}.reset_for_eval=True with {at}.repeat=True: one epoch per eval run needs a finite input that "
                f"raises StopIteration at its end; set {at}.repeat=False."
            )
        if not self.reset_for_eval and not static:
            raise ConfigError(
                f"{at}.reset_for_eval=False with {at}.eval_loop_num_batches={self.eval_loop_num_batches} (read "
                "until exhausted) is not supported (as in Pax): a rolling eval needs a fixed number of batches "
                f"per run; set {at}.eval_loop_num_batches=N > 0 with {at}.repeat=True, or "
                f"{at}.reset_for_eval=True with {at}.repeat=False for one epoch per run."
            )
        if not self.reset_for_eval and not self.repeat:
            raise ConfigError(
                f"{at}.reset_for_eval=False with {at}.repeat=False: rolling eval runs read "
                f"{self.eval_loop_num_batches} new batches each time, so the input must repeat forever; "
                f"set {at}.repeat=True."
            )


def eval_num_batches(cfg: InputConfig) -> int | None:
    """Batches one eval run reads: N for a static table cell, None = until StopIteration (the
    cell checked when the DataConfig holding `cfg` was made)."""
    return cfg.eval_loop_num_batches if cfg.eval_loop_num_batches > 0 else None
