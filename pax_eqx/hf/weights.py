"""Hugging Face tensor names and layouts <-> pax_eqx parameters, for each family.

    plan = weight_plan("llama", dims, our_names)       # every HF tensor and the leaves it makes
    arrays = plan.to_pax(entry, hf_tensor)             # one layer's [out, in] -> our [in, heads, head]

transformers stores a linear layer as nn.Linear's [out, in] (GPT-2's Conv1D: [in, out]); pax_eqx
stores `x @ w`'s [in, out] and the attention projections per head: w_q [embed, heads, head_dim],
w_o [heads, head_dim, embed]. A scanned stack (`model.repeat=True`) holds every layer of one
parameter on a leading [num_layers] axis: `stack.layers.attention.w_q` [L, D, N, H] is made of
the L tensors `model.layers.{i}.self_attn.q_proj.weight`. Each `Entry` is one HF tensor name
(with `{i}` for a layer's), the pax_eqx leaves it makes (GPT-2's fused c_attn makes three), and
the two conversions of one layer's arrays, which are exact inverses (a test checks both ways).

A stack of alternating local and global layers (`model.global_layer_interval` k, Gemma 2's 2)
scans blocks of k layers: block position j's parameter `stack.layers.{j}.attention.w_q`
[L / k, D, N, H] holds layers j, j + k, j + 2k, ... (row r is layer j + r * k). The plan reads
that layout from the names (`stack.layers.{j}.` for j < k) and gives each position's entry its
`offset` j; `WeightPlan.hf_name(entry, row)` is the tensor of one row, whatever the layout.

Gemma 2's four norms a layer map onto the primer_hybrid layer's: input_layernorm ->
attention_norm, post_attention_layernorm -> attention_post_norm (after attention, before the
residual add: where Llama's post_attention_layernorm is the feed-forward's pre-norm),
pre_feedforward_layernorm -> ff_norm, post_feedforward_layernorm -> ff_post_norm.

The plan is built from the model's own parameter names, so an optional tensor (a bias) is mapped
when the model has the parameter; an HF tensor nothing maps, or a parameter nothing fills, is an
error listing every one (`check_complete`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pax_eqx.hf.families import HfConfigError

STACK = "stack.layers."
_BLOCK = re.compile(r"^stack\.layers\.(\d+)\.")  # block position j of a scanned stack of blocks
# HF tensors that are buffers computed from the config, not weights: skipped on import.
_BUFFERS = (".rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")


@dataclass(frozen=True)
class Dims:
    """The sizes the layouts need: model width, query heads, key/value heads, head width."""

    model: int
    heads: int
    kv_heads: int
    head: int


@dataclass(frozen=True)
class Entry:
    """One HF tensor (`{i}`: the layer) and the pax_eqx leaves it makes; `per_layer` leaves are
    the stack's (one row of their leading axis per layer; in a stack of blocks, the layers of
    block position `offset`)."""

    hf: str
    pax: tuple[str, ...]
    to_pax: Callable[[np.ndarray], tuple[np.ndarray, ...]]
    to_hf: Callable[[tuple[np.ndarray, ...]], np.ndarray]
    per_layer: bool
    offset: int = 0


def _same(hf: str, pax: str, per_layer: bool = True) -> Entry:
    return Entry(hf, (pax,), lambda a: (np.asarray(a),), lambda p: p[0], per_layer)


def _transposed(hf: str, pax: str, per_layer: bool = True) -> Entry:
    """nn.Linear's [out, in] <-> [in, out]."""
    return Entry(hf, (pax,), lambda a: (np.asarray(a).T,), lambda p: p[0].T, per_layer)


def _heads_in(hf: str, pax: str, d: int, n: int, h: int) -> Entry:
    """A q/k/v projection: nn.Linear [n * h, d] <-> [d, n, h]."""
    return Entry(hf, (pax,), lambda a: (np.asarray(a).T.reshape(d, n, h),), lambda p: p[0].reshape(d, n * h).T, True)


def _heads_bias(hf: str, pax: str, n: int, h: int) -> Entry:
    return Entry(hf, (pax,), lambda a: (np.asarray(a).reshape(n, h),), lambda p: p[0].reshape(n * h), True)


def _llama_entries(dims: Dims, tied: bool, family: str) -> list[Entry]:
    d, n, k, h = dims.model, dims.heads, dims.kv_heads, dims.head
    layer, att = "model.layers.{i}.", STACK + "attention."
    norms = (
        {"input_layernorm": "attention_norm", "post_attention_layernorm": "attention_post_norm",
         "pre_feedforward_layernorm": "ff_norm", "post_feedforward_layernorm": "ff_post_norm"}
        if family == "gemma2"
        else {"input_layernorm": "attention_norm", "post_attention_layernorm": "ff_norm"}
    )  # fmt: skip
    out = [
        _same("model.embed_tokens.weight", "embedding.w" if tied else "embedding.emb_var", per_layer=False),
        _same("model.norm.weight", "final_norm.scale", per_layer=False),
        *(_same(layer + f"{hf}.weight", STACK + f"{ours}.scale") for hf, ours in norms.items()),
        _heads_in(layer + "self_attn.q_proj.weight", att + "w_q", d, n, h),
        _heads_in(layer + "self_attn.k_proj.weight", att + "w_k", d, k, h),
        _heads_in(layer + "self_attn.v_proj.weight", att + "w_v", d, k, h),
        Entry(
            layer + "self_attn.o_proj.weight",
            (att + "w_o",),
            lambda a: (np.asarray(a).T.reshape(n, h, d),),
            lambda p: p[0].reshape(n * h, d).T,
            True,
        ),  # fmt: skip
        _heads_bias(layer + "self_attn.q_proj.bias", att + "b_q", n, h),
        _heads_bias(layer + "self_attn.k_proj.bias", att + "b_k", k, h),
        _heads_bias(layer + "self_attn.v_proj.bias", att + "b_v", k, h),
        _same(layer + "self_attn.o_proj.bias", att + "b_o"),
        _transposed(layer + "mlp.gate_proj.weight", STACK + "ff_in.gate.w"),
        _transposed(layer + "mlp.up_proj.weight", STACK + "ff_in.linear.w"),
        _transposed(layer + "mlp.down_proj.weight", STACK + "ff_out.w"),
        _same(layer + "mlp.gate_proj.bias", STACK + "ff_in.gate_bias.b"),
        _same(layer + "mlp.up_proj.bias", STACK + "ff_in.bias.b"),
        _same(layer + "mlp.down_proj.bias", STACK + "ff_out_bias.b"),
    ]
    if not tied:
        out.append(_transposed("lm_head.weight", "softmax.w", per_layer=False))
    return out


def _gpt2_entries(dims: Dims) -> list[Entry]:
    """GPT-2's Conv1D weights are [in, out] already; c_attn is q, k and v side by side."""
    d, n, h = dims.model, dims.heads, dims.head
    layer, att = "h.{i}.", STACK + "attention."

    def split_qkv(a):
        return tuple(part.reshape(d, n, h) for part in np.split(np.asarray(a), 3, axis=1))

    def split_qkv_bias(a):
        return tuple(part.reshape(n, h) for part in np.split(np.asarray(a), 3))

    return [
        _same("wte.weight", "embedding.w", per_layer=False),
        _same("wpe.weight", "position.emb_var", per_layer=False),
        _same("ln_f.weight", "final_norm.scale", per_layer=False),
        _same("ln_f.bias", "final_norm.bias", per_layer=False),
        _same(layer + "ln_1.weight", STACK + "attention_norm.scale"),
        _same(layer + "ln_1.bias", STACK + "attention_norm.bias"),
        _same(layer + "ln_2.weight", STACK + "ff_norm.scale"),
        _same(layer + "ln_2.bias", STACK + "ff_norm.bias"),
        Entry(
            layer + "attn.c_attn.weight",
            (att + "w_q", att + "w_k", att + "w_v"),
            split_qkv,
            lambda p: np.concatenate([w.reshape(d, n * h) for w in p], axis=1),
            True,
        ),  # fmt: skip
        Entry(
            layer + "attn.c_attn.bias",
            (att + "b_q", att + "b_k", att + "b_v"),
            split_qkv_bias,
            lambda p: np.concatenate([b.reshape(n * h) for b in p]),
            True,
        ),  # fmt: skip
        Entry(
            layer + "attn.c_proj.weight",
            (att + "w_o",),
            lambda a: (np.asarray(a).reshape(n, h, d),),
            lambda p: p[0].reshape(n * h, d),
            True,
        ),  # fmt: skip
        _same(layer + "attn.c_proj.bias", att + "b_o"),
        _same(layer + "mlp.c_fc.weight", STACK + "ff_in.linear.w"),
        _same(layer + "mlp.c_fc.bias", STACK + "ff_in.bias.b"),
        _same(layer + "mlp.c_proj.weight", STACK + "ff_out.w"),
        _same(layer + "mlp.c_proj.bias", STACK + "ff_out_bias.b"),
    ]


@dataclass(frozen=True)
class WeightPlan:
    """The entries of one model: those whose leaves the model has. block_size: layers per
    scanned block (1: every per-layer leaf is [num_layers, ...])."""

    entries: tuple[Entry, ...]
    num_layers: int
    block_size: int = 1

    def hf_name(self, entry: Entry, row: int | None) -> str:
        """The HF tensor of row `row` of the entry's leaves (None: a leaf that is not per layer)."""
        return entry.hf if row is None else entry.hf.format(i=entry.offset + row * self.block_size)

    def hf_names(self, entry: Entry) -> list[str]:
        """The entry's tensors in the order of its leaves' rows."""
        if not entry.per_layer:
            return [entry.hf]
        return [self.hf_name(entry, row) for row in range(self.num_layers // self.block_size)]

    def producer(self) -> dict[str, tuple[Entry, int]]:
        """{our leaf name: (the entry that makes it, its position among the entry's leaves)}."""
        return {name: (e, k) for e in self.entries for k, name in enumerate(e.pax)}


def weight_plan(family: str, dims: Dims, num_layers: int, our_names: list[str], tied: bool) -> WeightPlan:
    """The entries that make `our_names` (the model's parameter names, `learners.variables`), in
    the stack's layout: one [num_layers, ...] leaf per parameter, or a scanned stack of blocks
    (`stack.layers.{j}.`, one leaf per block position j, each [num_layers / k, ...])."""
    entries = _gpt2_entries(dims) if family == "gpt2" else _llama_entries(dims, tied, family)
    positions = sorted({int(m.group(1)) for name in our_names if (m := _BLOCK.match(name))})
    block = len(positions) or 1
    if positions and (positions != list(range(block)) or num_layers % block):
        raise HfConfigError(
            f"the model's parameters name blocks {positions} of stack.layers, not 0..k-1 with k dividing "
            f"num_layers={num_layers}; import_hf reads a scanned stack (model.repeat=True)."
        )
    if positions:
        entries = [
            dataclasses.replace(e, pax=tuple(p.replace(STACK, f"{STACK}{j}.", 1) for p in e.pax), offset=j)
            if e.per_layer else e
            for e in entries
            for j in (range(block) if e.per_layer else (0,))
        ]  # fmt: skip
    ours = set(our_names)
    kept = tuple(e for e in entries if all(name in ours for name in e.pax))
    return WeightPlan(kept, num_layers, block)


def hf_name_in(files_names: set[str], name: str, family: str) -> str | None:
    """`name` as the checkpoint spells it: GPT-2's published files have no "transformer." prefix,
    what transformers' save_pretrained writes has one."""
    if name in files_names:
        return name
    if family == "gpt2" and "transformer." + name in files_names:
        return "transformer." + name
    return None


def check_complete(plan: WeightPlan, our_names: list[str], files_names: set[str], family: str) -> None:
    """HfConfigError listing every parameter nothing fills and every HF tensor nothing reads."""
    made = plan.producer()
    problems = [f"our parameter {name} has no Hugging Face tensor" for name in our_names if name not in made]
    read = set()
    for e in plan.entries:
        for name in plan.hf_names(e):
            found = hf_name_in(files_names, name, family)
            if found is None:
                problems.append(f"the Hugging Face tensor {name} (for {', '.join(e.pax)}) is not in the checkpoint")
            else:
                read.add(found)
    tied_head = {"lm_head.weight"} if "embedding.w" in made else set()  # a tied model's copy of the embedding
    for name in sorted(files_names - read - tied_head):
        if not name.endswith(_BUFFERS):
            problems.append(f"the Hugging Face tensor {name} is not used by this model")
    if problems:
        shown = problems[:40] + ([f"... and {len(problems) - 40} more"] if len(problems) > 40 else [])
        raise HfConfigError(
            "the checkpoint's tensors do not fit the model config.json describes:\n  " + "\n  ".join(shown)
        )
