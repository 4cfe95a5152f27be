"""`python -m pax_eqx.export_hf --job-log-dir DIR --out OUT [--dtype bfloat16] [--step N]`

Writes the newest (or step N's) parameters of a job dir into OUT in the Hugging Face layout:
config.json, model.safetensors (or shards of at most --max-shard-gb with
model.safetensors.index.json) and the tokenizer files, so that
`transformers.AutoModelForCausalLM.from_pretrained(OUT)` loads it. The parameters are the ones
eval and decode use (the EMA where the learner keeps one).

Which config.json:
- a job dir `import_hf` started: the imported model's own config.json (with the chosen dtype). A
  model whose config no longer matches it (another vocabulary, more layers) is refused: its
  config.json could not say what it is.
- a model trained here: one derived from the experiment's model (`pax_eqx.hf.config_from_model`:
  llama, mistral, qwen2, gemma, gemma2 or gpt2, checked by reading it back), or a refusal naming
  the field no family has (shakespeare_char's LayerNorm with rotary positions;
  shakespeare_char_llama maps). Its tokenizer files are what `pax_eqx.hf.tokenizer_export` can
  write honestly (the byte tokenizer as a byte-level tokenizer.json; none for SentencePiece),
  said in a printed line.

A LoRA run's job dir (`lora.targets`) exports its base with the adapters merged in, W + (alpha /
r) A @ B in each weight's HF orientation; the config.json, tokenizer and generation config are
its base job dir's. `--adapters-only` writes the adapters alone in PEFT's layout instead
(adapter_config.json, adapter_model.safetensors: `pax_eqx.hf.peft_export`), for
`peft.PeftModel.from_pretrained(base_model, OUT)`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from pax_eqx.command_line import entry
from pax_eqx.number_flags import number

DESCRIPTION = (
    "Export a job dir (one import_hf started, or a model trained here whose architecture is a Hugging Face family: "
    "llama, mistral, qwen2, gemma, gemma2, gpt2) to a Hugging Face directory: config.json, safetensors in the chosen "
    "dtype, tokenizer files."
)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = entry.OneLineParser(prog="python -m pax_eqx.export_hf", description=DESCRIPTION)
    parser.add_argument("--job-log-dir", "--job_log_dir", dest="job_log_dir", required=True, metavar="DIR")
    parser.add_argument("--out", required=True, metavar="OUT", help="the directory to write (new or empty)")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    parser.add_argument(
        "--step", type=number(int, ge=0), default=None, help="the checkpoint step (default: the newest)"
    )
    parser.add_argument(
        "--max-shard-gb", type=number(float, gt=0), default=5.0, help="the largest safetensors file, in GiB"
    )
    parser.add_argument(
        "--adapters-only", action="store_true",
        help="a LoRA run: write its adapters alone in PEFT's layout (default: the base with the adapters merged)",
    )  # fmt: skip
    ns = parser.parse_args(argv)
    files = export(
        Path(ns.job_log_dir), Path(ns.out), ns.dtype, ns.step, int(ns.max_shard_gb * 2**30), ns.adapters_only
    )
    print(f"Exported {ns.job_log_dir} to {ns.out} ({ns.dtype}): {', '.join(files)}.", flush=True)
    return 0


def export(job_dir: Path, out: Path, dtype: str = "bfloat16", step: int | None = None,
           max_shard_bytes: int = 5 * 2**30, adapters_only: bool = False) -> list[str]:  # fmt: skip
    import jax
    import numpy as np

    from pax_eqx.checkpoint import Checkpointer
    from pax_eqx.config import ConfigError, MissingFileError
    from pax_eqx.data import build_tokenizer
    from pax_eqx.experiment import ExperimentConfig
    from pax_eqx.hf.config_from_model import hf_export
    from pax_eqx.hf.export_leaves import ExportLeaves
    from pax_eqx.hf.exporter import copy_tokenizer, write_hf
    from pax_eqx.hf.families import model_config, model_type
    from pax_eqx.hf.importer import SOURCE_DIR, TOKENIZER_DIR
    from pax_eqx.hf.tokenizer_export import tokenizer_files
    from pax_eqx.job.job_dir import prepare
    from pax_eqx.learners.variables import path_name
    from pax_eqx.programs.compiled import Programs
    from pax_eqx.programs.lora_base import restore_state
    from pax_eqx.programs.runtime import build_task
    from pax_eqx.sharding.distributed import initialize
    from pax_eqx.sharding.mesh import build_mesh

    initialize()
    path = prepare(job_dir, create=False)
    exp = ExperimentConfig.from_dict(json.loads((path / "config.json").read_text()))
    if adapters_only and not exp.lora.enabled:
        raise ConfigError(
            f"--adapters-only: --job-log-dir {str(job_dir)!r} is not a LoRA run (its lora.targets are empty), so it "
            "has no adapters; drop --adapters-only to export its weights."
        )
    home = Path(exp.lora.base_job_dir) if exp.lora.enabled else path  # where import_hf wrote hf/ and tokenizer/
    source = home / SOURCE_DIR / "config.json"
    derived = None  # a model trained here: the config.json derived from its model, and its weight changes
    if source.is_file():
        hf_config = json.loads(source.read_text())
        imported, _ = model_config(hf_config)
        if _function(imported) != _function(exp.model):
            raise ConfigError(
                f"the model of {str(path / 'config.json')!r} is no longer the one {str(source)!r} describes (a size "
                "or option changed after the import); export_hf writes the imported architecture only."
            )
    else:
        exp.model.ensure_valid()
        derived = hf_export(exp.model)  # refuses a model no family has, naming the field
        hf_config = dict(derived.config)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file, not a directory; choose a new directory.")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {str(out)!r} is not empty; choose a new directory.")
    exp.validate(num_devices=jax.device_count())
    tokenizer = None
    if derived is not None and not adapters_only:
        tokenizer = tokenizer_files(build_tokenizer(exp.data, home), exp.data.tokenizer)
        hf_config.update(tokenizer.special_ids)
    programs = Programs(build_task(exp), build_mesh(exp.mesh), exp.mesh.rules)
    ckpt = Checkpointer(path / "checkpoints", exp.checkpoint, read_only=True)
    if ckpt.latest_step() is None:
        raise MissingFileError(f"no checkpoint in {path / 'checkpoints'} to export.")
    restored, state, _ = restore_state(ckpt, programs, exp, path, step, restore_data=False)
    ckpt.close()
    params = programs.task.inference_params(state)
    if adapters_only:
        files = _write_adapters(out, exp, hf_config, programs.task, params, dtype, home)
        print(f"Read step {restored} of {path}.", flush=True)
        return files
    if exp.lora.enabled:
        params = programs.task.merged_params(params)  # W + alpha / r * A @ B
    leaves = {path_name(p): a for p, a in jax.tree_util.tree_flatten_with_path(params)[0]}
    if derived is None:
        names, leaf = list(leaves), lambda name: np.asarray(jax.device_get(leaves[name]))
    else:
        leaf = ExportLeaves(leaves, exp.model.num_layers, not exp.model.repeat, derived.add_one, derived.zeros)
        names = leaf.names
    files = write_hf(
        out, model_type(hf_config), hf_config, names, leaf, dtype=dtype, max_shard_bytes=max_shard_bytes,
        check=leaf.check_written if derived is not None else None,
    )  # fmt: skip
    if tokenizer is None:
        copy_tokenizer(home / TOKENIZER_DIR, out)
    else:
        for name, text in tokenizer.files.items():
            (out / name).write_text(text)
        print(tokenizer.note, flush=True)
    if (home / SOURCE_DIR / "generation_config.json").is_file():
        (out / "generation_config.json").write_text((home / SOURCE_DIR / "generation_config.json").read_text())
    print(f"Read step {restored} of {path}.", flush=True)
    return files


def _write_adapters(out: Path, exp, hf_config: dict, task, params, dtype: str, home: Path) -> list[str]:
    """The adapters of `params` (LoraParams) in PEFT's layout (`pax_eqx.hf.peft_export`)."""
    import jax
    import numpy as np

    from pax_eqx.hf.families import model_type
    from pax_eqx.hf.peft_export import write_peft
    from pax_eqx.learners.variables import param_names

    adapters = {
        n: (np.asarray(jax.device_get(a.a)), np.asarray(jax.device_get(a.b))) for n, a in params.adapters.items()
    }
    base = hf_config.get("_name_or_path") or str(home.absolute())
    names = param_names(params.base)
    return write_peft(
        out, model_type(hf_config), exp.model, task.targets, adapters, rank=exp.lora.rank, alpha=exp.lora.alpha,
        base=base, all_names=names, dtype=dtype, dropout=exp.lora.dropout,
    )  # fmt: skip


def _function(model) -> dict:
    """The model's fields that decide what its weights compute (dropout and run options aside)."""
    d = model.to_dict()
    block = d.get("block", {})
    block.pop("residual_dropout_prob", None)
    block.get("attention", {}).pop("dropout_prob", None)
    for key in ("repeat", "remat_policy", "unroll", "loss_chunk_size", "pipeline"):
        d.pop(key, None)
    return d


if __name__ == "__main__":
    entry.run(main)
