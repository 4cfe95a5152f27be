"""`python -m pax_eqx.export --job-log-dir DIR --out OUT [--platforms cpu cuda] [--slots 4] [--chunk 64]
[--overwrite]`: the serving programs of a job dir's newest checkpoint as `jax.export` artifacts.

OUT receives prefill.stablehlo and generate.stablehlo (the two programs the server runs, as
serialized StableHLO), weights.npz (the inference parameters: the EMA where the learner keeps one),
state.npz (an empty decode-slot state), manifest.json (sizes, every input and output in call
order, the platforms, the model) and run_exported.py, which greedily continues token ids with
nothing but jax and numpy:

    python OUT/run_exported.py OUT 40 86 87 --max-tokens 8     # prints the 8 new token ids

pax_eqx.serving.exported_programs says what each file holds and why the inputs are flat arrays.
`--platforms` names where the programs may run (one file serves them all; lowering for a GPU
works on a machine without one). OUT must be new or empty (or `--overwrite`); it is written
whole or not at all. Only a language model that continues a prompt can be exported.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from pax_eqx import programs
from pax_eqx.command_line import cli, entry

PROG = "python -m pax_eqx.export"
DESCRIPTION = (
    "Export the newest checkpoint of a job dir's language model as jax.export artifacts: its prefill and generate "
    "programs (serialized StableHLO), weights.npz, state.npz, manifest.json and run_exported.py, a loader that needs "
    "only jax and numpy."
)
_FLAGS = [
    ("--out", dict(default=None, metavar="OUT", help="the directory to write (new or empty; see --overwrite)")),
    ("--platforms", dict(nargs="+", default=["cpu"], metavar="PLATFORM",
                         help="where the programs may run: cpu, cuda, rocm, tpu (its file runs on each named)")),
    ("--slots", dict(type=int, default=4, help="requests decoded at once (the KV cache's rows)")),
    ("--chunk", dict(type=int, default=64, help="prompt tokens prefilled per call (at most max_seq_len)")),
    ("--overwrite", dict(action="store_true", help="replace what OUT holds")),
]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    exp, job_dir, ns = cli.parse(
        argv, PROG, DESCRIPTION, extra=_FLAGS, saved_experiment=True, sections=("checkpoint", "mesh")
    )
    if not ns.out:
        raise cli.fail(f"--out is required: {PROG} --job-log-dir {job_dir} --out OUT")
    from pax_eqx.config import ConfigError
    from pax_eqx.serving.exported_programs import check_out_dir, check_platforms, check_sizes, export_slot_programs

    platforms = check_platforms(ns.platforms)
    out = Path(ns.out)
    check_out_dir(out, ns.overwrite)
    check_sizes(ns.slots, ns.chunk)
    kind = exp.model
    if not kind.decodes or kind.decodes_inputs or kind.decodes_examples or kind.fills_prompts:
        raise ConfigError(
            f"the experiment {exp.name!r} of --job-log-dir {job_dir!r} has a {type(kind).__name__}, not a language "
            "model that continues a prompt; export writes a language model's prefill and generate programs (decode "
            f"this job with python -m pax_eqx.decode --job-log-dir {job_dir})."
        )
    from pax_eqx.programs.restore import restore_for_inference

    rt, state, step = restore_for_inference(exp, job_dir, "export from")
    model = rt.programs.task.model(rt.programs.task.inference_params(state))
    exported = export_slot_programs(
        model, slots=ns.slots, chunk=ns.chunk, platforms=platforms, eos_id=rt.tokenizer.eos_id,
        tokenizer=rt.tokenizer, name=exp.name, step=step,
    )  # fmt: skip
    files = exported.write(out, overwrite=ns.overwrite)
    print(
        f"Exported step {step} of {job_dir} for {', '.join(platforms)} to {out}: {', '.join(files)}.\n"
        f"Run it with jax and numpy only: python {out / 'run_exported.py'} {out} TOKEN_ID ... --max-tokens 16",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    entry.run(main, memory_planner=programs.planned_bytes)
