"""A trained model's parameters in the layout the weight plan reads, for `export_hf`.

    leaves = ExportLeaves(params_by_name, num_layers, listed=not model.repeat, add_one=..., zeros=...)
    write_hf(out, family, config, leaves.names, leaves, ...)   # leaves(name) -> one host array
    leaves.check_written(plan)                                  # every parameter went somewhere

`hf.weights` maps the layout `import_hf` makes: one scanned stack (`stack.layers.attention.w_q`
[L, D, N, H]) with separate q, k and v. A model trained here may be laid out otherwise and still
compute the same function, so its leaves are presented in that layout, one at a time (a large
model is never copied whole into host memory):

- a listed stack (`model.repeat=False`: `stack.layers.{i}.X`) is stacked into `stack.layers.X`
  [L, ...] when that name is asked for (a scanned stack of blocks, `global_layer_interval` k, is
  named `stack.layers.{j}.X` too, j < k, and is passed on as it is: the plan reads that layout);
- a fused `w_qkv` [L, 3, D, N, H] (`attention.combine_qkv`) is offered as w_q, w_k and w_v;
- `add_one` names (an offset-stored norm scale, `config_from_model`; in a stack of blocks, each
  block position's) are given as scale + 1 in float32, what the model multiplies by; `zeros`
  names (a bias-free GPT-2's biases) as zeros.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from pax_eqx.hf.families import HfConfigError
from pax_eqx.hf.weights import WeightPlan

_LISTED = re.compile(r"^stack\.layers\.(\d+)\.(.+)$")
_BLOCK = re.compile(r"^stack\.layers\.\d+\.")  # a stack of blocks' position j
_FUSED = "attention.w_qkv"
# Parameters that are training state, not weights: fp8's delayed-scaling scales and histories.
_NOT_WEIGHTS = (".fp8.",)


class ExportLeaves:
    """Callable: name -> np.ndarray in the plan's layout; `names` lists every name it gives."""

    def __init__(
        self,
        leaves: Mapping[str, Any],
        num_layers: int,
        listed: bool = False,
        add_one: tuple[str, ...] = (),
        zeros: Mapping[str, tuple[int, ...]] | None = None,
    ):
        """leaves: our parameters by `learners.variables` name (device or host arrays). listed:
        the stack is a list of layers (`model.repeat=False`)."""
        get = lambda name: lambda: np.asarray(_host(leaves[name]))
        made: dict[str, Callable[[], np.ndarray]] = {}
        layers_of: dict[str, dict[int, str]] = {}  # a listed stack's parameter -> {layer: its leaf}
        for name in leaves:
            match = _LISTED.match(name) if listed else None
            if match:
                layers_of.setdefault(match.group(2), {})[int(match.group(1))] = name
            else:
                made[name] = get(name)
        for rest, by_layer in layers_of.items():
            if sorted(by_layer) != list(range(num_layers)):
                raise HfConfigError(
                    f"the listed stack's parameter stack.layers.{{i}}.{rest} has layers {sorted(by_layer)}, not 0.."
                    f"{num_layers - 1} (model.num_layers={num_layers}); the checkpoint does not fit its config.json."
                )
            made["stack.layers." + rest] = _stacked([get(by_layer[i]) for i in range(num_layers)])
        for name in [n for n in made if n.endswith(_FUSED)]:
            fused = made.pop(name)
            for k, part in enumerate(("w_q", "w_k", "w_v")):
                made[name.removesuffix("w_qkv") + part] = _part(fused, k)
        for name, shape in (zeros or {}).items():
            made[name] = lambda shape=shape: np.zeros(shape, np.float32)
        for name in list(made):
            if _BLOCK.sub("stack.layers.", name) in add_one:
                made[name] = _plus_one(made[name])
        self._made = made
        self.names = list(made)

    def __call__(self, name: str) -> np.ndarray:
        return self._made[name]()

    def check_written(self, plan: WeightPlan) -> None:
        """HfConfigError listing every weight no Hugging Face tensor holds (the config said it
        maps, so this is a bug in the mapping, stopped before a wrong directory is trusted)."""
        written = set(plan.producer())
        left = [n for n in self.names if n not in written and not any(s in n for s in _NOT_WEIGHTS)]
        if left:
            raise HfConfigError(
                f"export_hf would drop the parameters {', '.join(sorted(left))}: no Hugging Face tensor of this family "
                "holds them (a mapping bug; please report it with the model's config.json)."
            )


def _host(a: Any) -> Any:
    import jax

    return jax.device_get(a)


def _stacked(parts: list[Callable[[], np.ndarray]]) -> Callable[[], np.ndarray]:
    return lambda: np.stack([p() for p in parts])


def _part(fused: Callable[[], np.ndarray], k: int) -> Callable[[], np.ndarray]:
    """Row k of the fused [L, 3, D, N, H] (q, k, v)."""
    return lambda: np.ascontiguousarray(fused()[:, k])


def _plus_one(scale: Callable[[], np.ndarray]) -> Callable[[], np.ndarray]:
    """scale + 1 in float32: the factor `1.0 + scale` the model computes in its float32 norm."""
    return lambda: scale().astype(np.float32) + np.float32(1.0)
