"""`python -m pax_eqx.plots DIR [DIR ...] [--out OUT] [--smoothing W]`: draw a run's curves now, or compare runs.

One DIR: redraws DIR/plots/ (the trainer does it at every eval; this works any time, while it
runs or after), or draws into OUT. Several: each DIR's own plots, and every run's curves laid
over each other in OUT (default `plots_compare/`), one PNG per metric, each run labelled by the
config fields that differ between the runs. The training curves are smoothed as TensorBoard
smooths them (`--smoothing`, default 0.6; 0 = the raw points alone).

A bad input is one `error:` line (exit 2): a metrics.jsonl that is missing, empty, a directory or
holds a line that is not UTF-8; an OUT that is a file. A plot that cannot be written (a read-only
job dir) is one too (exit 1).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from pax_eqx.command_line import entry
from pax_eqx.config import ConfigError

DESCRIPTION = "Draw a job dir's training curves (DIR/plots/), or lay several runs over each other."


def main(argv: Sequence[str] | None = None) -> int:
    parser = entry.OneLineParser(prog="python -m pax_eqx.plots", description=DESCRIPTION)
    parser.add_argument("job_dirs", nargs="+", metavar="DIR", help="job dirs (each with a metrics.jsonl)")
    parser.add_argument(
        "--out", type=Path, default=None,
        help="where the plots go: one DIR's (default DIR/plots), or several runs' overlay (default plots_compare)",
    )  # fmt: skip
    parser.add_argument(
        "--smoothing", type=float, default=0.6, metavar="W",
        help="TensorBoard's smoothing of the training curves, in [0, 1): 0 = none (default 0.6)",
    )  # fmt: skip
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not 0 <= args.smoothing < 1:
        raise ConfigError(f"--smoothing {args.smoothing} is not in [0, 1); pass e.g. --smoothing 0.6, or 0 for none.")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise ConfigError(
            f"--out {str(args.out)!r} is a file; the plots are written into a directory, one PNG per metric: "
            f"pass a directory, new or existing (e.g. --out {str(args.out.parent / 'plots_compare')!r})."
        )
    from pax_eqx.job.errors import RunError
    from pax_eqx.summaries import write_overlay, write_plots
    from pax_eqx.summaries.writer import SummaryWriteError

    several = len(args.job_dirs) > 1
    try:
        for job_dir in args.job_dirs:
            out = args.out if not several else None
            written = write_plots(job_dir, out, smoothing=args.smoothing)
            if not written:
                raise ConfigError(_nothing_to_plot(Path(job_dir)))
            for path in written:
                print(path)
        if several:
            for path in write_overlay(args.job_dirs, args.out or Path("plots_compare"), smoothing=args.smoothing):
                print(path)
    except SummaryWriteError as e:
        fix = "make it writable, or pass --out OTHER_DIR to draw them elsewhere"
        if several:
            fix = "make it writable (each DIR's own plots go to DIR/plots, the overlay to --out)"
        raise RunError(f"{e}; {fix}.") from e
    return 0


def _nothing_to_plot(job_dir: Path) -> str:
    from pax_eqx.summaries.plots import PLOTS
    from pax_eqx.summaries.writer import METRICS_FILE

    path = job_dir / METRICS_FILE
    metrics = ", ".join(name for names, _, _ in PLOTS.values() for name in names)
    if path.stat().st_size == 0:
        return (
            f"{path} is empty: nothing to plot yet (the run logs a line every train.summary_interval_steps steps "
            "and at each eval); rerun once it has logged."
        )
    return f"{path} holds no train or eval line with a metric the plots draw ({metrics}); nothing to plot."


if __name__ == "__main__":
    entry.run(main)
