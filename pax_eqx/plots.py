"""`python -m pax_eqx.plots DIR [DIR ...] [--out OUT]`: draw a run's curves now, or compare runs.

One DIR: redraws DIR/plots/ (the trainer does it at every eval; this works any time, while it
runs or after). Several: each DIR's own plots, and every run's curves laid over each other in
OUT (default `plots_compare/`), one PNG per metric, labelled by experiment and job dir.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from pax_eqx.command_line import entry

DESCRIPTION = "Draw a job dir's training curves (DIR/plots/), or lay several runs over each other."


def main(argv: Sequence[str] | None = None) -> int:
    parser = entry.OneLineParser(prog="python -m pax_eqx.plots", description=DESCRIPTION)
    parser.add_argument("job_dirs", nargs="+", metavar="DIR", help="job dirs (each with a metrics.jsonl)")
    parser.add_argument("--out", type=Path, default=Path("plots_compare"), help="where several runs' overlay goes")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from pax_eqx.summaries import write_overlay, write_plots

    for job_dir in args.job_dirs:
        for path in write_plots(job_dir):
            print(path)
    if len(args.job_dirs) > 1:
        for path in write_overlay(args.job_dirs, args.out):
            print(path)
    return 0


if __name__ == "__main__":
    entry.run(main)
