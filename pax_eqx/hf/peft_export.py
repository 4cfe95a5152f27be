"""A LoRA run's adapters -> PEFT's layout (adapter_config.json, adapter_model.safetensors).

    write_peft(out, family, model_cfg, targets, adapters, rank=8, alpha=16.0, base="...", all_names=names)

PEFT names each adapted module by its Hugging Face path and keeps, per module,

    base_model.model.<module>.lora_A.weight   [r, in]
    base_model.model.<module>.lora_B.weight   [out, r]

and computes W_hf + (lora_alpha / r) * lora_B @ lora_A (transposed for GPT-2's Conv1D, whose
weight is [in, out]: `fan_in_fan_out`). Ours are A [*stack, *in, r] and B [*stack, r, *out] on
the pax_eqx side of the weight plan (`weights.py`), so for layer i: lora_A = A[i] flattened to
[in, r], transposed, and lora_B = B[i] flattened to [r, out], transposed. Whether the HF tensor is
[out, in] or [in, out] is read from the plan's own `to_hf` on a rank-1 probe (square weights
cannot be told apart by shape). A pax_eqx weight that is not one whole HF tensor (GPT-2's w_q,
w_k and w_v, fused into c_attn) or an embedding table (PEFT keeps those in another layout) is
refused with the export that works: the merged one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from pax_eqx.config import ConfigError
from pax_eqx.hf.exporter import DTYPES, save_file
from pax_eqx.hf.weights import Dims, Entry, weight_plan
from pax_eqx.tasks.lora_adapters import Target

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."


def hf_orientation(entry: Entry, target: Target) -> str:
    """ "out_in" when `entry`'s HF tensor is nn.Linear's [out, in], "in_out" for Conv1D's [in, out]."""
    rng = np.random.default_rng(0)
    u, v = rng.normal(size=math.prod(target.in_shape)), rng.normal(size=math.prod(target.out_shape))
    probe = np.outer(u, v).reshape(*target.in_shape, *target.out_shape)
    hf = np.asarray(entry.to_hf((probe,)))
    if hf.shape == (v.size, u.size) and np.allclose(hf, np.outer(v, u)):
        return "out_in"
    if hf.shape == (u.size, v.size) and np.allclose(hf, np.outer(u, v)):
        return "in_out"
    raise ConfigError(f"the Hugging Face tensor {entry.hf} is not a plain matrix of {target.name}; export merged.")


def _plan(family: str, model_cfg: Any, all_names: list[str]):
    dims = Dims(model_cfg.model_dims, model_cfg.num_heads, model_cfg.num_kv_heads or model_cfg.num_heads,
                model_cfg.head_dim)  # fmt: skip
    return weight_plan(family, dims, model_cfg.num_layers, all_names, not model_cfg.separate_embedding)


def peft_tensors(
    family: str,
    model_cfg: Any,
    targets: dict[str, Target],
    adapters: dict[str, tuple[np.ndarray, np.ndarray]],
    all_names: list[str],
) -> tuple[dict[str, np.ndarray], list[str], bool]:
    """({PEFT tensor name: array (float32)}, the adapted HF module names, fan_in_fan_out).
    `all_names`: every parameter name of the model (the weight plan is the whole model's)."""
    plan = _plan(family, model_cfg, all_names)
    made = plan.producer()
    prefix = "transformer." if family == "gpt2" else ""
    tensors: dict[str, np.ndarray] = {}
    modules: list[str] = []
    orientations = set()
    for name, target in sorted(targets.items()):
        entry, _ = made.get(name, (None, 0))
        if entry is None or len(entry.pax) != 1 or target.stack != (1 if entry.per_layer else 0):
            why = "it is part of a fused tensor" if entry is not None and len(entry.pax) > 1 else "it has no own tensor"
            raise ConfigError(
                f"--adapters-only: the adapted weight {name} cannot be written in PEFT's layout ({why} in the "
                f"{family} checkpoint); export the merged model (without --adapters-only), or adapt other weights."
            )
        if not entry.hf.endswith(".weight") or name.endswith(("embedding.w", "embedding.emb_var")):
            raise ConfigError(
                f"--adapters-only: {name} is an embedding table, which PEFT adapts in another layout; export the "
                "merged model (without --adapters-only)."
            )
        orientations.add(hf_orientation(entry, target))
        a, b = adapters[name]
        rank = a.shape[-1]
        for i, hf_name in enumerate(plan.hf_names(entry)):
            a_i, b_i = (a[i], b[i]) if entry.per_layer else (a, b)
            module = prefix + hf_name[: -len(".weight")]
            modules.append(module)
            tensors[f"{PREFIX}{module}.lora_A.weight"] = a_i.reshape(-1, rank).T
            tensors[f"{PREFIX}{module}.lora_B.weight"] = b_i.reshape(rank, -1).T
    if len(orientations) > 1:
        raise ConfigError("--adapters-only: the adapted weights mix [in, out] and [out, in] tensors; export merged.")
    return tensors, modules, orientations == {"in_out"}


def target_modules(adapted: list[str], all_modules: list[str]) -> list[str]:
    """PEFT's target_modules: a module's last name where every module of that name is adapted
    (PEFT adapts each module whose name ends with a target), else the adapted modules' full names."""
    out: set[str] = set()
    chosen = set(adapted)
    for module in adapted:
        short = module.rsplit(".", 1)[-1]
        same = [m for m in all_modules if m.rsplit(".", 1)[-1] == short]
        out.add(short if set(same) <= chosen else module)
    return sorted(out)


def write_peft(
    out: Path,
    family: str,
    model_cfg: Any,
    targets: dict[str, Target],
    adapters: dict[str, tuple[np.ndarray, np.ndarray]],
    *,
    rank: int,
    alpha: float,
    base: str,
    all_names: list[str],
    dtype: str = "float32",
    dropout: float = 0.0,
) -> list[str]:
    """Writes adapter_config.json and adapter_model.safetensors into `out`; returns their names.
    `all_names`: every parameter name of the model (for target_modules' short names); `dropout`: the
    run's lora.dropout, PEFT's lora_dropout (what a PEFT run that goes on training would use)."""
    tensors, modules, fan_in_fan_out = peft_tensors(family, model_cfg, targets, adapters, all_names)
    plan = _plan(family, model_cfg, all_names)
    prefix = "transformer." if family == "gpt2" else ""
    every = [prefix + n[: -len(".weight")] for e in plan.entries for n in plan.hf_names(e) if n.endswith(".weight")]
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": dropout,
        "target_modules": target_modules(modules, every),
        "base_model_name_or_path": base,
        "bias": "none",
        "fan_in_fan_out": fan_in_fan_out,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    out.mkdir(parents=True, exist_ok=True)
    np_dtype = DTYPES[dtype]
    save_file(
        {k: np.ascontiguousarray(v.astype(np_dtype)) for k, v in tensors.items()},
        str(out / ADAPTER_WEIGHTS),
        metadata={"format": "pt"},
    )
    (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return [ADAPTER_CONFIG, ADAPTER_WEIGHTS]
