"""`python -m pax_eqx.eval --exp NAME --job-log-dir DIR`: evaluate DIR's newest checkpoint."""

from __future__ import annotations

import json
from collections.abc import Sequence

from pax_eqx.programs import cli, entry

DESCRIPTION = "Evaluate the newest checkpoint of a job dir on the experiment's eval data."


def main(argv: Sequence[str] | None = None) -> int:
    exp, job_dir, _ = cli.parse(argv, "python -m pax_eqx.eval", DESCRIPTION)
    from pax_eqx.programs.eval_loop import evaluate
    from pax_eqx.programs.restore import restore_for_inference
    from pax_eqx.summaries import SummaryWriter

    rt, state, step = restore_for_inference(exp, job_dir)
    metrics = evaluate(rt, state)
    writer = SummaryWriter(rt.job_dir)
    writer.write(step, "eval", metrics)
    writer.close()
    print(json.dumps({"step": step, **metrics}))
    return 0


if __name__ == "__main__":
    entry.run(main)
