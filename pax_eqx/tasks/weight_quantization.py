"""Which weights of a model a quantization takes, and the two transforms of them (`ExperimentConfig.quantization`).

A weight is found by the layer that owns it, the same walk `sharding.logical` does for the
logical axes: a leaf's path through the model ends at its owner module and field, and the owner's
type says what the weight is and which of its axes a product sums over (its contraction axes,
counted from the end so a scanned stack's leading `layers` axis changes nothing):

    Linear.w                     dense      [in, out]                       (-2,)
    Attention.w_q, w_k, w_v      attention  [embed, heads, head_dim]        (-3,)
    Attention.w_qkv              attention  [3, embed, heads, head_dim]     (-3,)
    Attention.w_o                attention  [heads, head_dim, embed]        (-3, -2)
    MoEFeedForward.wi, wi_gate   moe        [experts, embed, mlp]           (-2,)
    MoEFeedForward.wo            moe        [experts, mlp, embed]           (-2,)
    Embedding.w                  embedding  [vocab, embed]                  (-1,)  a row per token id
    SharedEmbeddingSoftmax.w     embedding or softmax (one tied table)      (-1,)
    FullSoftmax.w                softmax    [embed, vocab]                  (-2,)
    Conv2D.w                     conv       [h, w, in, out]                 (-4, -3, -2)

Each weight gets one scale per output channel (and per layer of a stack). The two transforms:

- `fake_quantized(params, choice)`: each chosen weight quantized and dequantized, with Praxis'
  straight-through gradient (fake_quant, or AQT's quantizer): a pure function of the params, put
  inside the loss, so the optimizer updates the float weights (QAT).
- `materialized(params, choice)`: each chosen weight a `QuantizedWeight` (int8 or packed int4
  values and scales) carrying its logical axes for the sharding rules (PTQ, Praxis' MATERIALIZE).
  The same values fake_quant computes: a model trained with fake_quant quantizes to the weights it
  trained with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.tree_util as jtu

from pax_eqx.config import ConfigError
from pax_eqx.layers.attentions import Attention
from pax_eqx.layers.convolutions import Conv2D
from pax_eqx.layers.embedding_softmax import Embedding, FullSoftmax, SharedEmbeddingSoftmax
from pax_eqx.layers.linears import Linear
from pax_eqx.layers.moe import MoEFeedForward
from pax_eqx.quantization.operations import aqt_fake_quant, fake_quant
from pax_eqx.quantization.quantization_choice import AqtConfig, IntQuantizationConfig
from pax_eqx.quantization.quantized_weight import QuantizedWeight, quantize_weight

SITES: dict[type, dict[str, tuple[tuple[str, ...], tuple[int, ...]]]] = {
    Linear: {"w": (("dense",), (-2,))},
    Attention: {
        "w_q": (("attention",), (-3,)),
        "w_k": (("attention",), (-3,)),
        "w_v": (("attention",), (-3,)),
        "w_qkv": (("attention",), (-3,)),
        "w_o": (("attention",), (-3, -2)),
    },
    MoEFeedForward: {"wi": (("moe",), (-2,)), "wi_gate": (("moe",), (-2,)), "wo": (("moe",), (-2,))},
    Embedding: {"w": (("embedding",), (-1,))},
    SharedEmbeddingSoftmax: {"w": (("embedding", "softmax"), (-1,))},
    FullSoftmax: {"w": (("softmax",), (-2,))},
    Conv2D: {"w": (("conv",), (-4, -3, -2))},
}
"""{owner type: {field: (the layer names that choose it, its contraction axes)}} (module doc)."""

_LOOKED_UP = (Embedding,)
"""Owners whose weight is only looked up: no input to quantize, so no activation config."""


@dataclasses.dataclass(frozen=True)
class Site:
    """One chosen weight: its owner's type, field, contraction axes and logical axes (unstacked)."""

    owner: type
    field: str
    layers: tuple[str, ...]
    contract: tuple[int, ...]
    axes: tuple[str | None, ...] | None


def _site(tree: Any, path: tuple) -> Site | None:
    """The Site of the leaf at `path`, None when its owner's field is no weight a quantization takes."""
    node, owner, name = tree, None, None
    for entry in path:
        if isinstance(entry, jtu.GetAttrKey):
            owner, name = node, entry.name
            node = getattr(node, entry.name)
        elif isinstance(entry, jtu.SequenceKey):
            node = node[entry.idx]
        elif isinstance(entry, jtu.DictKey):
            node = node[entry.key]
        else:
            return None
    fields = SITES.get(type(owner), {})
    if name not in fields:
        return None
    layers, contract = fields[name]
    table = owner.param_axes() if hasattr(owner, "param_axes") else {}
    axes = tuple(table[name]) if name in table else None
    return Site(type(owner), name, layers, contract, axes)


def _is_weight(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, QuantizedWeight)


def _map_chosen(params: Any, choice: Any, fn: Callable[[Any, Site], Any]) -> Any:
    """`params` with each chosen weight replaced by fn(weight, site); ConfigError for a listed
    layer the model has none of, or a choice that takes no weight at all."""
    found: set[str] = set()

    def visit(path, leaf):
        if not _is_weight(leaf):
            return leaf
        site = _site(params, path)
        if site is None or not any(choice.chosen(layer) for layer in site.layers):
            return leaf
        found.update(layer for layer in site.layers if choice.chosen(layer))
        return fn(leaf, site)

    out = jtu.tree_map_with_path(visit, params)
    missing = [layer for layer in choice.layers if layer not in found]
    if missing or not found:
        raise ConfigError(
            f"quantization ({choice.kind}).layers={choice.layers!r}: the model has no "
            f"{' or '.join(missing) or 'quantizable'} weights, so "
            + ("those would do nothing" if missing else "nothing would be quantized")
            + "; name only layers it has (dense, attention, moe, embedding, softmax, conv) or quantization none."
        )
    return out


def check_sites(params: Any, choice: Any) -> None:
    """ConfigError when the choice names a layer the model lacks, or what `int` cannot take."""
    _map_chosen(params, choice, lambda w, site: _check_site(site, choice) or w)


def _check_site(site: Site, choice: Any) -> None:
    if isinstance(choice, IntQuantizationConfig) and site.owner is MoEFeedForward:
        raise ConfigError(
            f"quantization (int): the model's MoE experts ({site.field}) are multiplied by einsums that take no "
            "integers; pass --quantization.layers naming the others (dense attention embedding softmax), or train "
            "with fake_quant."
        )
    if site.owner is Conv2D and choice.activation_bits and choice.per_token:
        raise ConfigError(
            f"quantization ({choice.kind}).per_token=True with Conv2D kernels quantized: a convolution's input is "
            "quantized per tensor (Praxis'); pass --quantization.no-per-token, or leave conv out of layers."
        )


def fake_quantized(params: Any, choice: Any) -> Any:
    """`params` with each chosen weight fake-quantized (module doc), differentiable (the STE)."""
    fq = aqt_fake_quant if isinstance(choice, AqtConfig) else fake_quant

    def quant(w, site: Site):
        return fq(w, choice.weight_bits, site.contract, choice.symmetric, choice.clipping)

    return _map_chosen(params, choice, quant)


def materialized(params: Any, choice: IntQuantizationConfig) -> Any:
    """`params` with each chosen weight a QuantizedWeight (module doc). Works on arrays and, under
    `jax.eval_shape`, on their shapes (the structure eval and decode restore into)."""
    spec, act = choice.weight_spec(), choice.activation_spec()

    def quant(w, site: Site):
        _check_site(site, choice)
        q = quantize_weight(w, site.contract, spec, activations=None if site.owner in _LOOKED_UP else act)
        return dataclasses.replace(q, axes=site.axes)

    return _map_chosen(params, choice, quant)


def abstract_materialized(params: Any, choice: IntQuantizationConfig) -> Any:
    """`materialized` of abstract params (ShapeDtypeStructs): the quantized structure and shapes."""
    return jax.eval_shape(lambda p: materialized(p, choice), params)
