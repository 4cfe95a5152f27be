"""`python -m pax_eqx.inspect_data --exp NAME`: look at a few batches before training on them.

    python -m pax_eqx.inspect_data --exp shakespeare_char --split eval --num-batches 2 \\
        --num-infeed-hosts 2 --infeed-host-index 1 [--data.seq-len 128 ...]

The seed's advice made a command: "It's always a good idea to sanity check the data by
looking at a few batches", and "to test whether sharding is handled correctly, set different
values for num_infeed_hosts, infeed_host_index and see whether the inputs emit different
batches". Prints each field's shape, dtype and range, padding fractions, and a few decoded
rows. With `--job-log-dir`, the job's own tokenizer is used (a SentencePiece model trained
there); otherwise a SentencePiece tokenizer is trained in memory for the look.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pax_eqx.config import ConfigError
from pax_eqx.data import DataConfig, build_input, build_tokenizer, eval_num_batches
from pax_eqx.data.tokenizers import SPM_DIRNAME, SPM_FILENAME

DESCRIPTION = "Print shapes, dtypes, padding and decoded rows of a few batches of an experiment's data."


def inspect(
    data: DataConfig,
    split: str = "train",
    num_batches: int = 2,
    num_infeed_hosts: int | None = None,
    infeed_host_index: int | None = None,
    job_dir: str | os.PathLike | None = None,
    num_rows: int = 2,
    max_chars: int = 160,
) -> str:
    """A report on the first `num_batches` batches of `split` as this (or the given) host sees them."""
    if num_batches <= 0:
        raise ConfigError(f"--num-batches must be > 0, got {num_batches}.")
    data.validate()
    # Only read a job dir's tokenizer; never write one there from an inspection.
    has_model = job_dir is not None and (Path(job_dir) / SPM_DIRNAME / SPM_FILENAME).is_file()
    tokenizer = build_tokenizer(data, job_dir if has_model else None)
    inp = build_input(data, split, tokenizer, num_infeed_hosts, infeed_host_index)
    cfg = getattr(data, split)
    lines = [
        f"data.source={data.source!r} layout={data.layout!r} seq_len={data.seq_len} split={split!r}",
        f"tokenizer: {tokenizer!r} (pad {tokenizer.pad_id}, bos {tokenizer.bos_id}, eos {tokenizer.eos_id})",
        f"input: {inp!r}; global batch {cfg.batch_size * inp.shard.count} "
        f"({cfg.batch_size} per host x {inp.shard.count} hosts)",
    ]
    if split == "eval":
        n = eval_num_batches(cfg)
        lines.append(
            f"eval run: {'until StopIteration' if n is None else f'{n} batches'} "
            f"(reset_for_eval={cfg.reset_for_eval}, repeat={cfg.repeat})"
        )
    for b in range(num_batches):
        try:
            batch = inp.get_next()
        except StopIteration:
            lines.append(f"batch {b}: StopIteration (end of data)")
            break
        lines.append(f"batch {b}:")
        for name in sorted(batch):
            v = np.asarray(batch[name])
            rng = f"min {v.min()}, max {v.max()}" if v.size else "empty"
            lines.append(f"  {name:12s} {str(v.shape):12s} {str(v.dtype):8s} {rng}")
        if "weights" in batch:
            w = np.asarray(batch["weights"])
            row_weight = w.reshape(len(w), -1).sum(axis=1)
            lines.append(
                f"  padding: {float(np.mean(w == 0)):.1%} of positions, "
                f"{int(np.sum(row_weight == 0))} of {len(w)} rows fully padded"
            )
        if "segment_ids" in batch:
            seg = np.asarray(batch["segment_ids"])
            lines.append(f"  segments per row: max {int(seg.max())}, mean {float(seg.max(axis=-1).mean()):.2f}")
        if "ids" in batch and inp.tokenizer is not None:
            for r, text in enumerate(inp.ids_to_strings(batch["ids"][:num_rows])):
                shown = text if len(text) <= max_chars else text[:max_chars] + "..."
                lines.append(f"  row {r}: {shown!r}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from pax_eqx.programs import cli

    extra = (
        ("--split", {"choices": ("train", "eval"), "default": "train"}),
        ("--num-batches", {"type": int, "default": 2, "dest": "num_batches"}),
        ("--num-infeed-hosts", {"type": int, "default": None, "dest": "num_infeed_hosts"}),
        ("--infeed-host-index", {"type": int, "default": None, "dest": "infeed_host_index"}),
    )
    exp, job_dir, ns = cli.parse(
        argv, "python -m pax_eqx.inspect_data", DESCRIPTION, job_dir_required=False, extra=extra
    )
    print(inspect(exp.data, ns.split, ns.num_batches, ns.num_infeed_hosts, ns.infeed_host_index, job_dir))
    return 0


if __name__ == "__main__":
    from pax_eqx.programs import entry

    entry.run(main)
