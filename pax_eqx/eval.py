"""`python -m pax_eqx.eval --job-log-dir DIR`: evaluate DIR's newest checkpoint.

The experiment is the one DIR/config.json saved (every flag the run was trained with); flags
given change only what may differ from the run (the eval data's batches, the mesh, decode);
`--exp` is needed only for a job dir without a config.json.

Safe beside a running `train` on the same DIR: the checkpoint is read without changing
anything in DIR/checkpoints (pax_eqx.programs.restore), and the result goes to files of its
own -- one line appended to DIR/eval_results.jsonl (split "eval_separate") and the TensorBoard
run DIR/summaries/eval_separate/ -- never to the trainer's metrics.jsonl, summaries/eval/ or
plots. It is also printed as one JSON line on stdout.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pax_eqx import programs
from pax_eqx.command_line import cli, entry

DESCRIPTION = "Evaluate the newest checkpoint of a job dir on its experiment's eval data (read from DIR/config.json)."
SPLIT = "eval_separate"


def main(argv: Sequence[str] | None = None) -> int:
    exp, job_dir, _ = cli.parse(
        argv,
        "python -m pax_eqx.eval",
        DESCRIPTION,
        saved_experiment=True,
        sections=("data", "train", "checkpoint", "mesh"),
    )
    import jax

    from pax_eqx.job.errors import RunError
    from pax_eqx.programs.evaluate.eval_loop import evaluate
    from pax_eqx.programs.restore import restore_for_inference
    from pax_eqx.summaries.writer import EVAL_RESULTS_FILE, SummaryWriteError, SummaryWriter

    rt, state, step = restore_for_inference(exp, job_dir)
    metrics = evaluate(rt, state, files_dir=rt.job_dir / SPLIT)
    print(json.dumps({"step": step, **metrics}), flush=True)  # first: a failing write below loses nothing
    try:
        writer = SummaryWriter(rt.job_dir, enabled=jax.process_index() == 0, metrics_file=EVAL_RESULTS_FILE)
        writer.write(step, SPLIT, metrics)
        writer.close()
    except SummaryWriteError as e:
        raise RunError(
            f"{e}; the eval of step {step} ran and its result is the JSON line printed above. Free space (or fix "
            "the permissions) to record it."
        ) from e
    return 0


if __name__ == "__main__":
    entry.run(main, memory_planner=programs.planned_bytes)  # an out-of-memory line quotes the plan
