"""`python -m pax_eqx.inspect_data --exp NAME`: look at a few batches before training on them.

    python -m pax_eqx.inspect_data --exp shakespeare_char --split eval --num-batches 2 \\
        --num-infeed-hosts 2 --infeed-host-index 1 [--data.seq-len 128 ...]

The seed's advice made a command: "It's always a good idea to sanity check the data by
looking at a few batches", and "to test whether sharding is handled correctly, set different
values for num_infeed_hosts, infeed_host_index and see whether the inputs emit different
batches". Prints each field's shape, dtype and range, padding fractions, and a few decoded
rows. With `--job-log-dir`, the job's own tokenizer is used (a SentencePiece model trained
there); otherwise a SentencePiece tokenizer is trained in memory for the look.

For image inputs, `--image-grid grid.png` draws the first batch's images (`inputs` [B, H, W]
or [B, H, W, C], float) in a grid, each titled with its label; padding rows (weight 0) say so.
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
    image_grid: str | os.PathLike | None = None,
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
    lines = [f"{data.source.describe(data)} split={split!r}"]
    if data.source.reads_tokens:
        lines.append(
            f"tokenizer: {tokenizer!r} (pad {tokenizer.pad_id}, bos {tokenizer.bos_id}, eos {tokenizer.eos_id})"
        )
    lines.append(
        f"input: {inp!r}; global batch {cfg.batch_size * inp.shard.count} "
        f"({cfg.batch_size} per host x {inp.shard.count} hosts)"
    )
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
        if b == 0 and image_grid is not None:
            lines.append(f"  image grid: {write_image_grid(batch, image_grid, data.source.kind)}")
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
        if "target_paddings" in batch:
            pad = np.asarray(batch["target_paddings"])
            lines.append(f"  target padding: {float(np.mean(pad > 0.5)):.1%} of positions")
        # Token rows decoded: an LM's ids; a seq2seq model's inputs and targets (sentinels shown).
        for key in ("ids", "inputs", "targets"):
            if key not in batch or inp.tokenizer is None or np.asarray(batch[key]).ndim != 2:
                continue
            prefix = "row" if key == "ids" else key
            for r, text in enumerate(inp.ids_to_strings(batch[key][:num_rows])):
                shown = text if len(text) <= max_chars else text[:max_chars] + "..."
                lines.append(f"  {prefix} {r}: {shown!r}")
    return "\n".join(lines)


def write_image_grid(batch: dict, path: str | os.PathLike, source: str = "", max_images: int = 64) -> str:
    """Draws up to `max_images` of `batch["inputs"]` ([B, H, W] or [B, H, W, C] float) into a PNG
    grid titled with `batch["labels"]`; returns a one-line description. Each image is scaled to
    its own min..max for display (normalised inputs are not in 0..1)."""
    x = np.asarray(batch.get("inputs", np.zeros(0)))
    if x.ndim not in (3, 4) or not np.issubdtype(x.dtype, np.floating):
        raise ConfigError(
            f"--image-grid needs a batch whose `inputs` are float images [B, H, W] or [B, H, W, C]; "
            f"data.source={source!r} gives {x.dtype} {x.shape}. Use an image source (digits_images, images_npz, "
            "image_folder) or drop --image-grid."
        )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = x[:max_images]
    if x.ndim == 4 and x.shape[-1] not in (1, 3):
        x = x[..., :1]  # neither gray nor RGB: show the first channel
    labels = np.asarray(batch["labels"]) if "labels" in batch else None
    weights = np.asarray(batch["weights"]) if "weights" in batch else None
    cols = min(8, len(x))
    rows = -(-len(x) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(1.4 * cols, 1.6 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for i, (ax, img) in enumerate(zip(axes.flat, x)):
        lo, hi = float(img.min()), float(img.max())
        img = (img - lo) / (hi - lo) if hi > lo else np.zeros_like(img)
        ax.imshow(img[..., 0] if img.ndim == 3 and img.shape[-1] == 1 else img, cmap="gray", vmin=0, vmax=1)
        title = f"{labels[i]}" if labels is not None else ""
        if weights is not None and weights.reshape(len(weights), -1)[i].sum() == 0:
            title = "pad"
        ax.set_title(title, fontsize=9)
    fig.suptitle(f"{source or 'inputs'}: first {len(x)} images {tuple(x.shape[1:])}, titled with labels", fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"{len(x)} images {tuple(x.shape[1:])} written to {path}"


def main(argv: Sequence[str] | None = None) -> int:
    from pax_eqx.command_line import cli

    extra = (
        ("--split", {"choices": ("train", "eval"), "default": "train", "help": "which input (default: train)"}),
        ("--num-batches", {"type": int, "default": 2, "dest": "num_batches", "metavar": "N", "help": "default: 2"}),
        (
            "--num-infeed-hosts",
            {"type": int, "default": None, "dest": "num_infeed_hosts", "metavar": "N",
             "help": "look as one of N hosts would (default: the input's own setting)"},
        ),
        (
            "--infeed-host-index",
            {"type": int, "default": None, "dest": "infeed_host_index", "metavar": "I",
             "help": "which of the --num-infeed-hosts to be"},
        ),
        (
            "--image-grid",
            {"default": None, "dest": "image_grid", "metavar": "PATH",
             "help": "image inputs: draw the first batch into this PNG, titled with the labels"},
        ),
    )  # fmt: skip
    exp, job_dir, ns = cli.parse(
        argv, "python -m pax_eqx.inspect_data", DESCRIPTION, job_dir_required=False, extra=extra, sections=("data",)
    )
    report = inspect(
        exp.data,
        ns.split,
        ns.num_batches,
        ns.num_infeed_hosts,
        ns.infeed_host_index,
        job_dir,
        image_grid=ns.image_grid,
    )
    print(report)
    return 0


if __name__ == "__main__":
    from pax_eqx.command_line import entry

    entry.run(main)
