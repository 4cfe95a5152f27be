"""A pax_eqx LanguageModelConfig -> the Hugging Face config.json of the same function: the reverse
of `families.model_config`, for a model trained here (no imported config.json to write back).

    export = hf_export(model)
    export.family, export.config        # "llama", the config.json to write
    export.add_one, export.zeros        # what the weights need on the way out (see below)

Which models map (the families `transformers` builds from config.json alone):

    llama    RMSNorm + rotary positions + a gated feed-forward, no biases or biases on all of
             q/k/v/o (`attention_bias`) and on the feed-forward (`mlp_bias`); tied or not;
             num_kv_heads < num_heads is grouped-query attention; llama3 rotary scaling
    mistral  llama (no biases) with a sliding window on every layer (`attention.window`)
    qwen2    the same with `qkv_bias` (biases on q, k and v, none on the output or the MLP),
             with or without a sliding window (every layer, or all but every n-th)
    gemma    the same with `scale_embedding_sqrt_depth` and the (1 + w) RMSNorm (direct_scale False)
    gemma2   gemma with primer_hybrid norms (a norm before and after attention and feed-forward),
             logit caps, query_scale_dims, and sliding layers with every n-th global
    gpt2     LayerNorm + learned ("trainable") positions + a non-gated feed-forward, tied

The family is chosen by the few fields that decide it (the norm, the positions, the embedding
scale, the norm policy, qkv_bias, the window); a model no family has (LayerNorm with rotary
positions, sinusoidal positions, a Mixture-of-Experts feed-forward) is refused there, naming the
field. Every other field is then checked by the round trip itself: the config.json written here
is read back with `families.model_config`, and the model it describes must equal this one field
for field, except the fields that change nothing the weights compute from a sequence (NO_EFFECT,
each with why) and the layout changes the export makes exactly (below). A field that differs (a
gated GPT-2, a logit cap in a Llama, a window with global layers in a Mistral) is named in one
HfConfigError with the value the family would have, so an export either computes what this
model computes or is not written.

Layout changes the export makes (`ExportLeaves` applies them to the weights):
- a norm stored as an offset (direct_scale False: y = norm(x) * (1 + scale)) in a family that
  stores the factor (llama, mistral, qwen2, gpt2) is written as scale + 1, computed in float32 as the
  model computes it (`add_one`); Gemma and Gemma 2 store the offset themselves, so it stays;
- a GPT-2-shaped model without biases (attention, feed-forward, LayerNorm) is written with zero
  biases, which add nothing (`zeros`): GPT2LMHeadModel always has them;
- a fused w_qkv is split into q, k and v; a listed stack (`repeat=False`) is stacked.

Not mapped: a window in a Llama with biases (MistralForCausalLM has none), a pattern of global
layers in a Mistral (it windows every layer), and what no family has (MoE, per_dim_scale, a
post-norm policy, learned positions with RMSNorm, ...).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pax_eqx.hf.families import HfConfigError, model_config
from pax_eqx.models.language_model import LanguageModelConfig

EXPORTED = ("llama", "mistral", "qwen2", "gemma", "gemma2", "gpt2")
_ARCHITECTURES = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
    "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM", "gpt2": "GPT2LMHeadModel",
}  # fmt: skip
_SLIDING, _FULL = "sliding_attention", "full_attention"  # transformers' layer_types
_FIX = (
    "train a model that maps (--exp shakespeare_char_llama is shakespeare_char as a Llama; docs/fine_tune.md, "
    "'Export a model trained here', lists what maps)"
)
# Fields (paths under `model.`) that do not change what the weights compute from a sequence.
NO_EFFECT = {
    "repeat": "the layers' layout in memory (one scanned stack or a list); the export stacks a list",
    "unroll": "how many layers a scan step runs",
    "remat_policy": "what the backward pass recomputes",
    "pipeline": "how the layers are split over devices",
    "loss_chunk_size": "how the loss is computed, not the logits",
    "label_smoothing_prob": "the training loss only",
    "init": "the initial weights only",
    "embedding_init": "the initial weights only",
    "block.residual_dropout_prob": "training only",
    "block.relu_dropout_prob": "training only",
    "block.residual_droppath_prob": "training only",
    "block.attention.dropout_prob": "training only",
    "block.attention.implementation": "the kernel, not the function",
    "block.attention.mask_mode": "what padded positions see; a real token's logits are the same",
    "block.ff_paddings": "zeroes padded positions only",
    "block.fp8": "the precision of training's matmuls; the weights are stored in float",
    "block.attention.combine_qkv": "q, k and v in one array: the export splits it",
}
_POST_NORMS = ("stack.layers.attention_post_norm.scale", "stack.layers.ff_post_norm.scale")  # primer_hybrid's


def _norm_scales(m: LanguageModelConfig) -> dict[str, tuple[str, ...]]:
    """Our parameters (as the weight plan names them; a stack of blocks' `stack.layers.{j}.` aside)
    of each norm config's scales."""
    post = _POST_NORMS if m.block.norm_policy == "primer_hybrid" else ()
    return {
        "block.norm": ("stack.layers.attention_norm.scale", "stack.layers.ff_norm.scale", *post),
        "final_norm": ("final_norm.scale",),
    }


@dataclasses.dataclass(frozen=True)
class HfExport:
    """What the export writes for a model: its family, config.json, and the weight changes.

    add_one: our parameters written as value + 1 (an offset-stored norm scale in a family that
      stores the factor). zeros: parameters the family has and the model does not, written as
      zeros of the given shape (a bias-free GPT-2's biases)."""

    family: str
    config: dict[str, Any]
    add_one: tuple[str, ...] = ()
    zeros: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)


def hf_export(model: LanguageModelConfig) -> HfExport:
    """The Hugging Face form of `model`, checked by reading it back (see the module doc). Raises
    HfConfigError naming the field no family can honour. The tokenizer's ids (bos_token_id, ...)
    are the caller's to add to the config: they change nothing the model computes."""
    family, why = _family(model)
    exported = _as_exported(model, family)
    config = {"architectures": [_ARCHITECTURES[family]], "model_type": family}
    config.update(_gpt2(exported) if family == "gpt2" else _llama_like(exported, family))
    back, _ = model_config(config)
    differences = _differences(_function(exported), _function(back), "model")
    if differences:
        raise HfConfigError(
            f"model maps to no Hugging Face family export_hf writes: its {why} make it {family}, but {family} has "
            f"{'; '.join(differences)}; change those fields, or {_FIX}."
        )
    add_one = tuple(
        name
        for field, names in _norm_scales(model).items()
        if _offset_scale(_norm(model, field)) and not _offset_scale(_norm(exported, field))
        for name in names
    )
    return HfExport(family, config, add_one, _zeros(model, exported))


def _family(m: LanguageModelConfig) -> tuple[str, str]:
    """The one family the deciding fields allow, and those fields in words; HfConfigError if none."""
    if m.moe_layer_interval:
        _refuse(
            f"model.moe_layer_interval={m.moe_layer_interval} is a Mixture-of-Experts model; none of the families "
            f"export_hf writes ({', '.join(EXPORTED)}) has one"
        )
    norm, pos = m.block.norm.kind, m.position_embedding
    if pos == "rotary":
        if norm != "rms_norm":
            _refuse(
                f"model.block.norm is {norm} but model.position_embedding='rotary': no Hugging Face family has this "
                "(llama, mistral, qwen2, gemma and gemma2 are rms_norm + rotary, gpt2 is layer_norm + trainable "
                "positions)"
            )
        if m.scale_embedding_sqrt_depth and m.block.norm_policy == "primer_hybrid":
            return "gemma2", "rms_norm, rotary positions, sqrt(model_dims) embedding scale and primer_hybrid norms"
        if m.scale_embedding_sqrt_depth:
            return "gemma", "rms_norm, rotary positions and sqrt(model_dims) embedding scale"
        if m.block.attention.qkv_bias:
            return "qwen2", "rms_norm, rotary positions and q/k/v biases"
        if m.block.attention.window.kind != "global":
            return "mistral", "rms_norm, rotary positions and a sliding window"
        return "llama", "rms_norm and rotary positions"
    if pos == "trainable":
        if norm != "layer_norm":
            _refuse(
                f"model.block.norm is {norm} but model.position_embedding='trainable': gpt2, the family with learned "
                "positions, is layer_norm (the others are rms_norm + rotary)"
            )
        return "gpt2", "layer_norm and learned positions"
    _refuse(
        f"model.position_embedding={pos!r}: the families export_hf writes have rotary positions (all but gpt2) "
        "or learned ones (gpt2, position_embedding='trainable')"
    )
    raise AssertionError  # unreachable: _refuse raises


def _refuse(why: str) -> None:
    raise HfConfigError(f"model maps to no Hugging Face family export_hf writes: {why}; {_FIX}.")


def _norm(m: LanguageModelConfig, field: str):
    return m.block.norm if field == "block.norm" else m.final_norm


def _offset_scale(norm) -> bool:
    """The norm has a scale, stored as an offset from one (y = norm(x) * (1 + scale))."""
    return norm.has_scale and not getattr(norm, "direct_scale", True)


def _as_exported(m: LanguageModelConfig, family: str) -> LanguageModelConfig:
    """`m` with the layout changes the export makes to the weights (module doc) applied to its
    config: the model transformers will build, if every other field maps."""
    block = m.block

    def direct(norm):
        return norm.replace(direct_scale=True) if family not in ("gemma", "gemma2") and _offset_scale(norm) else norm

    norm, final = direct(block.norm), direct(m.final_norm)
    attention = block.attention.replace(combine_qkv=False)
    ff_bias = block.ff_has_bias
    if family == "gpt2":
        attention = attention.replace(use_bias=True, qkv_bias=False)
        ff_bias = True
        norm, final = (n.replace(use_bias=True) if n.kind == "layer_norm" else n for n in (norm, final))
    block = block.replace(norm=norm, attention=attention, ff_has_bias=ff_bias)
    return m.replace(block=block, final_norm=final)


def _zeros(m: LanguageModelConfig, exported: LanguageModelConfig) -> dict[str, tuple[int, ...]]:
    """The biases `exported` has and `m` does not (GPT-2's), with their stacked shapes."""
    layers, d, n, h, f = m.num_layers, m.model_dims, m.num_heads, m.head_dim, m.hidden_dims
    kv = m.num_kv_heads or n
    att, stack = "stack.layers.attention.", "stack.layers."
    out: dict[str, tuple[int, ...]] = {}
    before, after = m.block.attention, exported.block.attention
    if after.use_bias and not before.use_bias:
        out[att + "b_o"] = (layers, d)
        if not before.qkv_bias:
            out.update({att + "b_q": (layers, n, h), att + "b_k": (layers, kv, h), att + "b_v": (layers, kv, h)})
    if exported.block.ff_has_bias and not m.block.ff_has_bias:
        out.update({stack + "ff_in.bias.b": (layers, f), stack + "ff_out_bias.b": (layers, d)})
        if m.block.activation.gated:
            out[stack + "ff_in.gate_bias.b"] = (layers, f)
    for field, scale_names in _norm_scales(m).items():
        was, now = _norm(m, field), _norm(exported, field)
        if getattr(now, "use_bias", False) and not getattr(was, "use_bias", False):
            for name in scale_names:
                out[name.removesuffix(".scale") + ".bias"] = (layers, d) if name.startswith(stack) else (d,)
    return out


def _hf_activation(m: LanguageModelConfig, family: str) -> str:
    """transformers' name of the feed-forward activation (families.ACTIVATIONS read backwards)."""
    name = m.block.activation.name
    names = {"silu": "silu", "swish": "silu", "relu": "relu", "gelu_exact": "gelu",
             "gelu": "gelu_new" if family == "gpt2" else "gelu_pytorch_tanh"}  # fmt: skip
    if family in ("gemma", "gemma2") and name == "gelu_exact":
        _refuse(
            "model.block.activation.name='gelu_exact' with the gemma layout: transformers reads Gemma's "
            "hidden_act='gelu' as the tanh form, so the erf form has no Gemma config.json (use 'gelu', the tanh form)"
        )
    if name not in names:
        _refuse(
            f"model.block.activation.name={name!r} has no transformers activation name here (these map: "
            f"{', '.join(sorted(names))})"
        )
    return names[name]


def _llama_like(m: LanguageModelConfig, family: str) -> dict[str, Any]:
    att = m.block.attention
    out = {
        "vocab_size": m.vocab_size, "hidden_size": m.model_dims, "intermediate_size": m.hidden_dims,
        "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_heads,
        "num_key_value_heads": m.num_kv_heads or m.num_heads, "head_dim": m.head_dim,
        "max_position_embeddings": m.max_seq_len, "rms_norm_eps": float(m.block.norm.epsilon),
        "hidden_act": _hf_activation(m, family), "rope_theta": float(att.rotary_max_timescale),
        "rope_scaling": _rope_scaling(m), "attention_dropout": float(att.dropout_prob),
        "tie_word_embeddings": not m.separate_embedding,
    }  # fmt: skip
    if family in ("llama", "gemma", "gemma2"):
        out["attention_bias"] = bool(att.use_bias)
    if family == "llama":
        out["mlp_bias"] = bool(m.block.ff_has_bias)
    window = att.window.left_context if att.window.kind == "sliding" else None
    if family == "mistral":
        out["sliding_window"] = window
    if family == "qwen2":
        out.update(use_sliding_window=window is not None, sliding_window=window, max_window_layers=0)
        if window is not None:
            out["layer_types"] = _layer_types(m)
    if family == "gemma2":
        out.pop("hidden_act")  # Gemma 2 reads hidden_activation only
        out.update(
            hidden_activation=_hf_activation(m, family), query_pre_attn_scalar=_query_pre_attn_scalar(m),
            attn_logit_softcapping=att.logit_cap or None, final_logit_softcapping=m.soft_cap_logits or None,
            sliding_window=window, layer_types=_layer_types(m),
        )  # fmt: skip
    return out


def _query_pre_attn_scalar(m: LanguageModelConfig) -> int:
    """Gemma 2's logit scale 1/sqrt(query_pre_attn_scalar): transformers' Gemma2Config takes a whole number."""
    value = m.block.attention.query_scale_dims or m.head_dim
    if not float(value).is_integer():
        _refuse(
            f"model.block.attention.query_scale_dims={value}: Gemma 2's query_pre_attn_scalar is a whole number in "
            "transformers' Gemma2Config"
        )
    return int(value)


def _layer_types(m: LanguageModelConfig) -> list[str]:
    """Each layer's kind as transformers lists it: sliding where the window applies, full at
    layers n - 1, 2n - 1, ... (model.global_layer_interval n) and everywhere without a window."""
    n = m.global_layer_interval
    if m.block.attention.window.kind == "global":
        return [_FULL] * m.num_layers
    return [_FULL if n and (i + 1) % n == 0 else _SLIDING for i in range(m.num_layers)]


def _rope_scaling(m: LanguageModelConfig) -> dict[str, Any] | None:
    scaling = m.block.attention.rotary_scaling
    if scaling.kind == "none":
        return None
    if scaling.kind != "llama3":
        _refuse(
            f"model.block.attention.rotary_scaling={scaling.kind!r}: config.json's rope_scaling here is llama3's or "
            "none"
        )
    return {
        "rope_type": "llama3", "factor": float(scaling.factor), "low_freq_factor": float(scaling.low_freq_factor),
        "high_freq_factor": float(scaling.high_freq_factor),
        "original_max_position_embeddings": int(scaling.original_max_position),
    }  # fmt: skip


def _gpt2(m: LanguageModelConfig) -> dict[str, Any]:
    return {
        "vocab_size": m.vocab_size, "n_positions": m.max_seq_len, "n_embd": m.model_dims, "n_layer": m.num_layers,
        "n_head": m.num_heads, "n_inner": m.hidden_dims, "activation_function": _hf_activation(m, "gpt2"),
        "layer_norm_epsilon": float(m.block.norm.epsilon), "attn_pdrop": float(m.block.attention.dropout_prob),
        "resid_pdrop": float(m.block.residual_dropout_prob), "embd_pdrop": 0.0, "scale_attn_weights": True,
        "tie_word_embeddings": True,
    }  # fmt: skip


def _function(m: LanguageModelConfig) -> dict[str, Any]:
    """The model's fields that decide what its weights compute: NO_EFFECT dropped, head widths
    and key/value heads as numbers (0 = the default)."""
    d = m.to_dict()
    d["dim_per_head"], d["num_kv_heads"] = m.head_dim, m.num_kv_heads or m.num_heads
    for path in NO_EFFECT:
        *parents, leaf = path.split(".")
        node = d
        for p in parents:
            node = node.get(p, {})
        node.pop(leaf, None)
    return d


def _differences(ours: Any, theirs: Any, path: str) -> list[str]:
    """'path=theirs (this model: ours)' for each field that differs; a choice of another kind (a
    layer_norm for an rms_norm) is one difference, named by its kind."""
    if isinstance(ours, dict) and isinstance(theirs, dict) and ours.get("kind") == theirs.get("kind"):
        out = []
        for key in ours.keys() | theirs.keys():
            out += _differences(ours.get(key), theirs.get(key), f"{path}.{key}")
        return sorted(out)
    if ours == theirs:
        return []
    show = lambda v: repr(v.get("kind")) if isinstance(v, dict) and "kind" in v else repr(v)
    return [f"{path}={show(theirs)} (this model: {show(ours)})"]
