"""`python -m pax_eqx.import_hf SRC --job-log-dir DIR [--section.field VALUE ...]`

Turns a local Hugging Face model directory (config.json, model.safetensors or its shards with
model.safetensors.index.json, tokenizer.json) of a Llama (2, 3, 3.1), Mistral, Qwen2, Gemma,
Gemma 2 or GPT-2 model into a pax_eqx job dir at step 0:

    DIR/config.json             the experiment config.json describes (pax_eqx.hf.families: every
                                field mapped, known to change nothing, or refused by name), with
                                the tokenizer below and the flags given here
    DIR/checkpoints/0/          the weights, in the mesh's shardings, and a fresh optimizer state
    DIR/tokenizer/tokenizer.json  the model's tokenizer (data.tokenizer tokenizer_json)
    DIR/hf/config.json          the source's config.json, which export_hf writes back out

so that `python -m pax_eqx.decode --job-log-dir DIR --prompt "..."` prints text and
`python -m pax_eqx.train --exp DIR/config.json --job-log-dir DIR --train.num-steps N` fine-tunes. What a resumed run
may not change (the model, the data, the learner) is chosen here: pass `--data.source jsonl
--data.path FILE`, `--learner.*` as to `train` (docs/fine_tune.md).

The weights are read one tensor block at a time from memory maps of the safetensors files straight
into their devices' shards (pax_eqx.hf.streaming), never as a second copy of the model. Everything
that can be refused (the config, the tensors' names and shapes, the flags) is refused before DIR is
touched.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from pax_eqx.command_line import entry

DESCRIPTION = (
    "Import a local Hugging Face model directory (Llama, Mistral, Qwen2, Gemma, Gemma 2, GPT-2) into a new pax_eqx "
    "job dir at step 0, for decode, eval and train (fine-tuning). Flags after SRC set any field of the derived "
    "experiment (--data.source jsonl --data.path FILE, --learner.*, --train.*)."
)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = entry.OneLineParser(prog="python -m pax_eqx.import_hf", description=DESCRIPTION)
    parser.add_argument("src", metavar="SRC", help="a local Hugging Face model directory")
    parser.add_argument("--job-log-dir", "--job_log_dir", dest="job_log_dir", required=True, metavar="DIR")
    ns, rest = parser.parse_known_args(argv)
    from pax_eqx.command_line import cli
    from pax_eqx.hf.importer import HfSource

    source = HfSource.open(ns.src)
    import jax

    default = source.experiment(ns.job_log_dir, num_devices=jax.device_count())
    exp = cli.parse_fields(default, rest, "python -m pax_eqx.import_hf SRC --job-log-dir DIR")
    print(f"Read {source.directory} ({source.family}, {source.files.nbytes / 1e6:.1f} MB of weights).", flush=True)
    for note in source.notes:
        print(f"note: {note}", flush=True)
    return _write(source, exp, Path(ns.job_log_dir))


def _write(source, exp, job_dir: Path) -> int:
    import jax

    from pax_eqx.checkpoint import Checkpointer
    from pax_eqx.import_pax import _refuse_used_job_dir
    from pax_eqx.job.job_dir import prepare
    from pax_eqx.programs.compiled import Programs
    from pax_eqx.programs.runtime import build_task
    from pax_eqx.sharding.distributed import initialize
    from pax_eqx.sharding.mesh import build_mesh

    initialize()
    exp.validate(num_devices=jax.device_count())
    _refuse_used_job_dir(Checkpointer(job_dir / "checkpoints", read_only=True), job_dir)
    programs = Programs(build_task(exp), build_mesh(exp.mesh), exp.mesh.rules)
    abstract = programs.abstract_state.params
    source.plan(exp.model, _names(abstract))  # tensors that do not fit: before DIR is touched
    created = not job_dir.exists()
    path = prepare(job_dir)
    try:
        return _import_into(source, exp, path, programs, abstract)
    except BaseException:
        if created and jax.process_index() == 0 and not (path / "config.json").exists():
            shutil.rmtree(path, ignore_errors=True)  # a failed import leaves no half-written job dir
        raise


def _import_into(source, exp, path: Path, programs, abstract) -> int:
    import jax

    from pax_eqx.checkpoint import Checkpointer
    from pax_eqx.import_pax import _refuse_used_job_dir
    from pax_eqx.job.job_dir import exclusive, write_config
    from pax_eqx.programs.train.state_from_params import state_with_params

    with exclusive(path, lock=jax.process_index() == 0):
        _refuse_used_job_dir(Checkpointer(path / "checkpoints", read_only=True), path)
        if jax.process_index() == 0:
            source.copy_tokenizer(path)
            source.copy_source_config(path)
        params = source.load_params(abstract, programs.state_shardings.params, exp.model)
        state = state_with_params(programs, params, exp.train.seed)
        ckpt = Checkpointer(path / "checkpoints", exp.checkpoint)
        try:
            ckpt.save(0, state, None, force=True)
            ckpt.wait_until_finished()
        finally:
            ckpt.close()
        if jax.process_index() == 0:
            write_config(path, exp.to_dict())
    print(
        f"Imported {source.family} into {path} at step 0. Sample: python -m pax_eqx.decode --job-log-dir {path} "
        f"--prompt TEXT; fine-tune: python -m pax_eqx.train --job-log-dir {path} --data.source jsonl --data.path "
        "FILE.jsonl --train.num-steps N (the learner and data flags are yours to choose).",
        flush=True,
    )
    return 0


def _names(abstract) -> list[str]:
    import jax

    from pax_eqx.learners.variables import path_name

    return [path_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(abstract)[0]]


if __name__ == "__main__":
    entry.run(main)
