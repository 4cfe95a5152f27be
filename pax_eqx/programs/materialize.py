"""Post-training quantization of a job dir into a new one (Praxis' MATERIALIZE): `python -m pax_eqx.quantize`.

DIR's newest (or a chosen) checkpoint is restored as eval restores it; its inference parameters
(the EMA where one is kept) are quantized (`tasks.weight_quantization.materialized`: each chosen
weight an int8 or packed-int4 QuantizedWeight, per-channel scales) and written to OUT as a
checkpoint of the same step, with no optimizer state and no EMA, beside a config.json that is
DIR's with `quantization` set to `int` (the bits, layers and grid). eval, decode and serve on
OUT rebuild the quantized structure from that config (`MaterializedTask`) and restore into it.

A job dir trained with quantization-aware training (fake_quant, aqt) quantizes with its own
grid (bits, symmetric, clipping, layers), so the integers are the values its forward trained
with (exactly for fake_quant, whose rounding and scale PTQ shares; AQT's eps and ties-up rounding
move a value by one step at most).

DIR's other files (its tokenizer, the data files it names, command.txt) are copied; its logs,
summaries and plots are not: OUT starts its own. Everything is checked before OUT is written.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from pax_eqx.checkpoint import Checkpointer
from pax_eqx.config import ConfigError, MissingFileError
from pax_eqx.experiment import ExperimentConfig
from pax_eqx.job.job_dir import prepare, write_config
from pax_eqx.programs.compiled import Programs
from pax_eqx.programs.lora_base import restore_state
from pax_eqx.programs.runtime import build_task
from pax_eqx.quantization.quantization_choice import IntQuantizationConfig
from pax_eqx.sharding.mesh import build_mesh
from pax_eqx.tasks.train_state import TrainState

NOT_COPIED = {"checkpoints", "summaries", "plots", "metrics.jsonl", "eval_results.jsonl", "train.log", "config.json"}
"""DIR's entries OUT does not take: its checkpoints (OUT writes its own), logs and curves."""


def quantization_for(exp: ExperimentConfig, bits: int | None, activation_bits: int, layers: tuple[str, ...]) -> Any:
    """The int choice OUT records: a QAT job's grid (bits unless given, symmetric, clipping, layers
    unless given), else Praxis' defaults (symmetric, no clipping) with these bits and layers."""
    trained = exp.quantization
    if trained.kind == "int":
        raise ConfigError(
            "--job-log-dir holds a materialized model already (quantization=int); quantize the float job dir it was "
            "made from."
        )
    if trained.enabled:
        return IntQuantizationConfig(
            weight_bits=trained.weight_bits if bits is None else bits,
            activation_bits=activation_bits,
            symmetric=trained.symmetric,
            clipping=trained.clipping,
            layers=layers or tuple(name for name in trained.layers if name != "moe"),
        )
    if bits is None:
        raise ConfigError("--bits is needed for a job dir trained in float: pass --bits 8 or --bits 4.")
    return IntQuantizationConfig(weight_bits=bits, activation_bits=activation_bits, layers=layers)


def float32_bytes(params: Any) -> int:
    """Bytes of the parameters held as float32 (4 a value), the measure the sizes compare to."""
    return sum(4 * int(np.prod(x.shape)) for x in jax.tree.leaves(params))


def tree_bytes(tree: Any) -> int:
    """Bytes of the arrays of `tree` as they are stored."""
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def materialize(
    job_dir: str | Path,
    out: str | Path,
    bits: int | None,
    *,
    activation_bits: int = 0,
    layers: tuple[str, ...] = (),
    step: int | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Writes OUT (module doc); returns {step, bits, float32_bytes, checkpoint_bytes, ratio}."""
    from pax_eqx.sharding.distributed import initialize

    initialize()
    path = prepare(job_dir, create=False)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise MissingFileError(f"{str(config_file)!r} does not exist; quantize a job dir train or import_hf wrote.")
    exp = ExperimentConfig.from_dict(json.loads(config_file.read_text()))
    choice = quantization_for(exp, bits, activation_bits, layers)
    if exp.lora.enabled:
        raise ConfigError(
            f"--job-log-dir {str(job_dir)!r} is a LoRA run; export its merged model (python -m pax_eqx.export_hf) or "
            "quantize its base job dir."
        )
    qexp = dataclasses.replace(exp, quantization=choice)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {str(out)!r} exists and is not an empty directory; choose a new directory.")
    if out.resolve() == path.resolve():
        raise ConfigError("--out is --job-log-dir; write the quantized model to a directory of its own.")
    exp.validate(num_devices=jax.device_count())
    qexp.validate(num_devices=jax.device_count())
    mesh = build_mesh(exp.mesh)
    quantized = build_task(qexp)  # refuses a layer selection the model cannot take, before anything is read
    programs = Programs(build_task(exp), mesh, exp.mesh.rules)
    ckpt = Checkpointer(path / "checkpoints", exp.checkpoint, read_only=True)
    if ckpt.latest_step() is None:
        raise MissingFileError(f"no checkpoint in {path / 'checkpoints'} to quantize; train first.")
    restored, state, data_state = restore_state(ckpt, programs, exp, path, step)
    ckpt.close()
    params = programs.task.inference_params(state)
    qparams = jax.jit(quantized.quantize)(params)
    qstate = TrainState(state.step, qparams, state.nt_state, quantized.optimizer.init(qparams), None, state.key)
    out = prepare(out)
    for entry in path.iterdir():
        if entry.name in NOT_COPIED:
            continue
        (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, out / entry.name)
    write_config(out, qexp.to_dict())
    writer = Checkpointer(out / "checkpoints", qexp.checkpoint)
    writer.save(restored, qstate, data_state, force=True, config=qexp.to_dict())
    writer.wait_until_finished()
    writer.close()
    sizes = {
        "step": restored,
        "bits": choice.weight_bits,
        "float32_bytes": float32_bytes(params),
        "quantized_params_bytes": tree_bytes(qparams),
        "checkpoint_bytes": directory_bytes(out / "checkpoints"),
    }
    sizes["ratio"] = sizes["checkpoint_bytes"] / sizes["float32_bytes"]
    log(
        f"Quantized step {restored} of {path} to {choice.weight_bits}-bit weights in {out}: checkpoint "
        f"{sizes['checkpoint_bytes']:,} bytes = {sizes['ratio']:.3f}x the float32 parameters' "
        f"{sizes['float32_bytes']:,} bytes (the arrays alone: {sizes['quantized_params_bytes']:,})."
    )
    return sizes
