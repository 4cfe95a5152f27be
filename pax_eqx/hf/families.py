"""A Hugging Face config.json -> the pax_eqx LanguageModelConfig of the same function.

    model, notes = model_config(json.load(open("Llama-3.1-8B/config.json")))

Families (`model_type`): llama (Llama 2 and 3, with Llama 3.1's rope scaling), mistral, qwen2,
gemma, gemma2, gpt2. Every field of config.json is either mapped onto a pax_eqx field, or known to
have no effect on what the model computes (listed in IGNORED or the family's own, with why), or
refused: a field this module does not know, or a value pax_eqx cannot honour (another rope
scaling, a pattern of sliding and full layers pax_eqx cannot build, quantized weights), is an
HfConfigError that names the field and the value. So an import either computes the same function
as transformers or stops. A field config.json leaves out takes the value transformers gives it
(its config class's default: Mistral's sliding_window 4096, Gemma 2's soft caps 50 and 30); a
field written as null is off.

What the families share (the "llama" layout): pre-norm RMSNorm blocks, rotary positions (theta =
`rope_theta`, halves rotated as `rotate_half`), grouped-query attention, a gated feed-forward
(down(act(gate(x)) * up(x))), an untied or tied softmax. Their differences are fields here:
Qwen2's q/k/v biases (`AttentionConfig.qkv_bias`), Gemma's (1 + w) norm scale (`direct_scale=False`)
and sqrt(hidden_size) embedding scale (`scale_embedding_sqrt_depth`), Llama 3.1's frequencies
(`rotary_scaling llama3`). Mistral's, Qwen2's and Gemma 2's `sliding_window` is the attention's
sliding window (`AttentionConfig.window`, over layers chosen by `layer_types` or the family's
older implicit rule: `hf.layer_windows`), and the model keeps max_position_embeddings as its
context: a sequence longer than the window runs as transformers runs it.

Gemma 2 is Gemma with, in each layer, a norm before and after both attention and feed-forward
(`norm_policy="primer_hybrid"`: x + post_norm(f(norm(x)))), attention logits scaled by
1/sqrt(`query_pre_attn_scalar`) (`query_scale_dims`) then capped at +-`attn_logit_softcapping`
(`logit_cap`), final logits capped at +-`final_logit_softcapping` (`soft_cap_logits`), and
local and global layers alternating from a local layer 0 (`global_layer_interval=2`).

GPT-2 is pre-norm LayerNorm, learned positions, a non-gated GELU (tanh form) feed-forward with
biases, biases everywhere in attention, tied embeddings.
"""

from __future__ import annotations

from typing import Any

from pax_eqx.config import ConfigError
from pax_eqx.hf.layer_windows import ALL_GLOBAL, KINDS, SLIDING, LayerWindows, describe, implicit_types, layer_windows
from pax_eqx.layers.activations import ActivationConfig
from pax_eqx.layers.attention_config import AttentionConfig
from pax_eqx.layers.normalizations import LayerNormConfig, RmsNormConfig
from pax_eqx.layers.rotary_scaling import Llama3RotaryScalingConfig, NoRotaryScalingConfig
from pax_eqx.layers.transformers import TransformerConfig
from pax_eqx.models.language_model import LanguageModelConfig

FAMILIES = ("llama", "mistral", "qwen2", "gemma", "gemma2", "gpt2")


class HfConfigError(ConfigError):
    """config.json describes a model pax_eqx cannot reproduce exactly (a user error: exit 2)."""


# Fields that do not change what the model computes from its weights.
IGNORED = {
    "architectures": "the class name transformers builds",
    "model_type": "read to choose the family",
    "transformers_version": "the writer's version",
    "torch_dtype": "the stored dtype is read from the safetensors files",
    "dtype": "the stored dtype is read from the safetensors files",
    "use_cache": "a transformers runtime option",
    "initializer_range": "the init of a model trained from scratch",
    "bos_token_id": "the tokenizer's (data.tokenizer.bos_token)",
    "eos_token_id": "the tokenizer's (data.tokenizer.eos_token)",
    "pad_token_id": "the tokenizer's (data.tokenizer.pad_token)",
    "_name_or_path": "where transformers loaded it from",
    "output_attentions": "a transformers runtime option",
    "output_hidden_states": "a transformers runtime option",
    "return_dict": "a transformers runtime option",
    "tokenizer_class": "the tokenizer is tokenizer.json",
    "pretraining_tp": "Llama 2's tensor-parallel matmul split: the same product",
    "task_specific_params": "generation settings",
    "id2label": "a classification head's",
    "label2id": "a classification head's",
    "chunk_size_feed_forward": "0 or not, the same product",
    "cache_implementation": "which KV cache class transformers' generate uses (Gemma 2's 'hybrid')",
}
# Generation defaults some older config.json files carry: sampling settings, not the model.
GENERATION = {
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "temperature", "top_k", "top_p",
    "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "num_return_sequences",
    "bad_words_ids", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values", "diversity_penalty",
    "num_beam_groups", "encoder_no_repeat_ngram_size", "output_scores", "return_dict_in_generate",
    "decoder_start_token_id", "sep_token_id", "prefix", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "tie_encoder_decoder", "is_decoder", "cross_attention_hidden_size",
    "finetuning_task", "torchscript", "pruned_heads", "problem_type",
}  # fmt: skip
# When set to these values, a field asks for nothing pax_eqx lacks; any other value is refused.
MUST_BE = {
    "is_encoder_decoder": (False,),
    "add_cross_attention": (False,),
    "quantization_config": (None,),
    "use_bidirectional_attention": (None, False),
}
# transformers' activation names -> pax_eqx's (the tanh GELU is pax_eqx's "gelu").
ACTIVATIONS = {
    "silu": "silu", "swish": "silu", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu_fast": "gelu",
    "gelu": "gelu_exact", "relu": "relu",
}  # fmt: skip
_FAMILY_TIES = {"llama": False, "mistral": False, "qwen2": False, "gemma": True, "gemma2": True, "gpt2": True}


def model_type(cfg: dict[str, Any]) -> str:
    family = cfg.get("model_type")
    if family not in FAMILIES:
        raise HfConfigError(
            f"config.json model_type={family!r} is not one of the families pax_eqx imports ({', '.join(FAMILIES)})."
        )
    return family


def model_config(cfg: dict[str, Any]) -> tuple[LanguageModelConfig, list[str]]:
    """The model of config.json `cfg`, and notes on what was read differently than stored (a
    sliding window no sequence can outgrow, a field with no pax_eqx counterpart that acts in
    training only). Raises HfConfigError naming every field it cannot honour."""
    family = model_type(cfg)
    reader = _Reader(cfg)
    model = (_gpt2 if family == "gpt2" else _llama_like)(reader, family)
    reader.finish()
    return model, reader.notes


class _Reader:
    """config.json's fields, each read at most once; `finish` refuses those nobody read."""

    def __init__(self, cfg: dict[str, Any]):
        self.cfg, self.read, self.notes, self.problems = cfg, set(), [], []

    def get(self, name: str, default: Any = None) -> Any:
        self.read.add(name)
        value = self.cfg.get(name, default)
        return default if value is None else value

    def given(self, name: str, default: Any) -> Any:
        """The value transformers reads: its config class's `default` when the field is absent,
        None when it is written as null (`get` reads null as the default)."""
        self.read.add(name)
        return self.cfg.get(name, default)

    def need(self, name: str) -> Any:
        self.read.add(name)
        if self.cfg.get(name) is None:
            self.problems.append(f"{name} is missing (it is required for model_type={self.cfg.get('model_type')!r})")
        return self.cfg.get(name)

    def refuse(self, name: str, why: str) -> None:
        self.problems.append(f"{name}={self.cfg.get(name)!r}: {why}")

    def note(self, text: str) -> None:
        self.notes.append(text)

    def finish(self) -> None:
        for name, value in self.cfg.items():
            if name in self.read or name in IGNORED or name in GENERATION:
                continue
            if name in MUST_BE:
                if value not in MUST_BE[name]:
                    self.refuse(
                        name, f"pax_eqx imports decoder-only, unquantized models (it must be {MUST_BE[name][0]!r})"
                    )
                continue
            self.problems.append(f"{name}={value!r}: pax_eqx.import_hf does not know this field")
        if self.problems:
            raise HfConfigError(
                f"config.json (model_type={self.cfg.get('model_type')!r}) describes a model pax_eqx cannot reproduce "
                "exactly:\n  " + "\n  ".join(self.problems)
            )


def _activation(r: _Reader, names: tuple[str, ...], gated: bool) -> ActivationConfig:
    """The first of `names` that is set (Gemma's hidden_activation before hidden_act)."""
    for name in names:
        value = r.get(name)
        if value is None:
            continue
        if value not in ACTIVATIONS:
            r.refuse(name, f"an activation pax_eqx does not have (it has {', '.join(sorted(ACTIVATIONS))})")
            return ActivationConfig(gated=gated)
        return ActivationConfig(name=ACTIVATIONS[value], gated=gated)
    r.refuse(names[-1], "no activation is named")
    return ActivationConfig(gated=gated)


def _gemma_activation(r: _Reader) -> ActivationConfig:
    """Gemma's MLP computes `hidden_act`, where "gelu", the value of the first published
    config.json files, means the tanh GELU (transformers rewrites it so, warning that the releases
    meant the approximation); `hidden_activation`, which later files also carry, is not read."""
    name = r.get("hidden_act", "gelu_pytorch_tanh")
    if name == "gelu":
        r.note('hidden_act="gelu" is the tanh GELU for Gemma (transformers reads the legacy value so).')
        name = "gelu_pytorch_tanh"
    other = r.get("hidden_activation")
    if other is not None and ACTIVATIONS.get(other) != ACTIVATIONS.get(name):
        r.note(f"hidden_activation={other!r} is not used: Gemma computes hidden_act={name!r}, as transformers does.")
    if name not in ACTIVATIONS:
        r.refuse("hidden_act", f"an activation pax_eqx does not have (it has {', '.join(sorted(ACTIVATIONS))})")
        return ActivationConfig(gated=True)
    return ActivationConfig(name=ACTIVATIONS[name], gated=True)


def _rope(r: _Reader) -> tuple[float, Any]:
    """(theta, rotary scaling) from transformers 5's `rope_parameters` or the published
    checkpoints' `rope_theta` + `rope_scaling`."""
    params = dict(r.get("rope_parameters", {}) or {})
    theta = params.pop("rope_theta", None)
    theta = r.get("rope_theta", 10000.0) if theta is None else theta
    field = "rope_parameters" if "rope_parameters" in r.cfg else "rope_scaling"
    scaling = params if params else dict(r.get("rope_scaling", {}) or {})
    rope_type = scaling.pop("rope_type", scaling.pop("type", "default"))
    if rope_type == "default":
        return float(theta), NoRotaryScalingConfig()
    if rope_type != "llama3":
        r.refuse(field, f"rope_type {rope_type!r} is not supported (pax_eqx has llama3's scaling, or none)")
        return float(theta), NoRotaryScalingConfig()
    known = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
    unknown = sorted(set(scaling) - known)
    if unknown or not known <= set(scaling):
        r.refuse(field, f"llama3 scaling needs exactly {sorted(known)}")
        return float(theta), NoRotaryScalingConfig()
    return float(theta), Llama3RotaryScalingConfig(
        factor=float(scaling["factor"]),
        low_freq_factor=float(scaling["low_freq_factor"]),
        high_freq_factor=float(scaling["high_freq_factor"]),
        original_max_position=int(scaling["original_max_position_embeddings"]),
    )


def _llama_like(r: _Reader, family: str) -> LanguageModelConfig:
    d, heads = r.need("hidden_size"), r.need("num_attention_heads")
    kv = r.get("num_key_value_heads", heads)
    head_dim = r.get("head_dim", (d // heads) if d and heads else 0)
    max_len, layers = r.need("max_position_embeddings"), r.need("num_hidden_layers")
    theta, scaling = _rope(r)
    gemma, gemma2 = family in ("gemma", "gemma2"), family == "gemma2"
    windows = _layer_windows(r, family, layers, max_len) if family in ("mistral", "qwen2", "gemma2") else ALL_GLOBAL
    attention_bias = bool(r.get("attention_bias", False)) if family in ("llama", "gemma", "gemma2") else False
    dropout = float(r.get("attention_dropout", 0.0))
    eps = float(r.get("rms_norm_eps", 1e-6))
    norm = RmsNormConfig(epsilon=eps, direct_scale=not gemma)
    if gemma2:
        activation = _gemma2_activation(r)
        logit_cap, final_cap = _cap(r, "attn_logit_softcapping", 50.0), _cap(r, "final_logit_softcapping", 30.0)
        query_dims = _query_scale_dims(r, head_dim)
    else:
        activation = _gemma_activation(r) if gemma else _activation(r, ("hidden_act",), gated=True)
        logit_cap = final_cap = query_dims = 0.0
    block = TransformerConfig(
        norm_policy="primer_hybrid" if gemma2 else "pre",
        norm=norm,
        attention=AttentionConfig(
            use_bias=attention_bias,
            qkv_bias=family == "qwen2",
            rotary_max_timescale=theta,
            rotary_scaling=scaling,
            dropout_prob=dropout,
            window=windows.window,
            logit_cap=logit_cap,
            query_scale_dims=query_dims,
        ),  # fmt: skip
        activation=activation,
        ff_has_bias=bool(r.get("mlp_bias", False)) if family == "llama" else False,
    )
    return LanguageModelConfig(
        vocab_size=r.need("vocab_size"), max_seq_len=max_len, num_layers=layers,
        model_dims=d, hidden_dims=r.need("intermediate_size"), num_heads=heads,
        dim_per_head=head_dim if head_dim * heads != d else 0, num_kv_heads=kv if kv != heads else 0,
        position_embedding="rotary", separate_embedding=not r.get("tie_word_embeddings", _FAMILY_TIES[family]),
        block=block, final_norm=norm, scale_embedding_sqrt_depth=gemma, soft_cap_logits=final_cap,
        global_layer_interval=windows.global_layer_interval,
    )  # fmt: skip


def _layer_windows(r: _Reader, family: str, num_layers: Any, max_len: Any) -> LayerWindows:
    """Which layers slide, and over how many keys: `layer_types` where config.json lists them
    (transformers 5 writes it for qwen2 and gemma2), else the family's older rule; refused by
    the field it came from when pax_eqx cannot build the pattern (`hf.layer_windows`)."""
    if not isinstance(num_layers, int) or not isinstance(max_len, int):
        return ALL_GLOBAL  # a missing size is refused already
    # transformers' defaults: Mistral and Gemma 2 slide unless the field is null; Qwen2 only with use_sliding_window.
    window = r.given("sliding_window", 4096)
    use = True
    if family == "qwen2":
        use = bool(r.get("use_sliding_window", False))
        window = window if use else None
    if family == "gemma2" and r.given("sliding_window_size", window) != window:
        r.refuse("sliding_window_size", f"an older name of sliding_window, which is {window!r}: they must agree")
    if window is not None and (not isinstance(window, int) or window < 1):
        r.refuse("sliding_window", "a window is a whole number of tokens >= 1 (null: none)")
        return ALL_GLOBAL
    max_window_layers = r.get("max_window_layers", 28) if family == "qwen2" else 0
    implicit = implicit_types(family, num_layers, use_sliding=window is not None, max_window_layers=max_window_layers)
    field, types = "layer_types", r.get("layer_types")
    if types is None:
        field, types = (
            {"qwen2": "max_window_layers", "gemma2": "num_hidden_layers"}.get(family, "layer_types"),
            implicit,
        )
    elif not isinstance(types, list) or len(types) != num_layers or any(t not in KINDS for t in types):
        r.refuse("layer_types", f"it must list num_hidden_layers={num_layers} kinds, each one of {KINDS}")
        return ALL_GLOBAL
    elif family == "mistral" and types != implicit:
        r.refuse("layer_types", "MistralForCausalLM ignores it and windows every layer by sliding_window; give a list "
                 "that agrees (or remove it)")  # fmt: skip
        return ALL_GLOBAL
    elif family == "qwen2" and not use and SLIDING in types:
        r.refuse("layer_types", "it names sliding layers, but use_sliding_window is false: transformers gives them no "
                 "window; set use_sliding_window true, or list full_attention layers only")  # fmt: skip
        return ALL_GLOBAL
    windows = layer_windows(types, window, max_len)
    if windows is None:
        r.problems.append(
            f"{field}: {describe(types)}; pax_eqx windows every layer, or every layer but n-1, 2n-1, ... "
            "(model.global_layer_interval n), and cannot build this pattern"
        )
        return ALL_GLOBAL
    if window is not None and window >= max_len and SLIDING in types:
        r.note(
            f"sliding_window={window} is not shorter than max_position_embeddings={max_len}: every key is within "
            "the window, so the layers attend globally (the same keys)."
        )
    return windows


def _gemma2_activation(r: _Reader) -> ActivationConfig:
    """Gemma 2's MLP reads `hidden_activation` (transformers' default: gelu_pytorch_tanh); the
    `hidden_act` its published config.json files also carry is never read by transformers."""
    name = r.given("hidden_activation", "gelu_pytorch_tanh")
    other = r.get("hidden_act")
    if other is not None and other != name:
        r.note(f"hidden_act={other!r} is not used: Gemma 2 computes hidden_activation={name!r}, as transformers does.")
    if name not in ACTIVATIONS:
        r.refuse("hidden_activation", f"an activation pax_eqx does not have (it has {', '.join(sorted(ACTIVATIONS))})")
        return ActivationConfig(gated=True)
    return ActivationConfig(name=ACTIVATIONS[name], gated=True)


def _cap(r: _Reader, name: str, default: float) -> float:
    """A soft cap c (logits -> c * tanh(logits / c)): `default` when absent, 0 (off) when null."""
    value = r.given(name, default)
    if value is None:
        return 0.0
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        r.refuse(name, "a soft cap is a number > 0 (null: no cap)")
        return 0.0
    return float(value)


def _query_scale_dims(r: _Reader, head_dim: Any) -> float:
    """Gemma 2 scales the logits by 1/sqrt(query_pre_attn_scalar) (transformers' default: 256);
    0 when that is the head dim, pax_eqx's default scale."""
    value = r.given("query_pre_attn_scalar", 256)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        r.refuse("query_pre_attn_scalar", "the logits are scaled by its 1/sqrt: it must be a number > 0")
        return 0.0
    return 0.0 if value == head_dim else float(value)


def _gpt2(r: _Reader, family: str) -> LanguageModelConfig:
    d = r.need("n_embd")
    positions = r.need("n_positions")
    if r.get("n_ctx", positions) != positions:
        r.refuse("n_ctx", f"it differs from n_positions={positions}")
    if not r.get("scale_attn_weights", True):
        r.refuse("scale_attn_weights", "pax_eqx always scales attention logits by 1/sqrt(head dim)")
    if r.get("scale_attn_by_inverse_layer_idx", False):
        r.refuse("scale_attn_by_inverse_layer_idx", "pax_eqx has no per-layer logit scale")
    r.get("reorder_and_upcast_attn")  # bf16 numerics only: pax_eqx computes softmax in float32 anyway
    for name in ("summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
                 "summary_first_dropout"):  # fmt: skip
        r.get(name)  # GPT2DoubleHeadsModel's classification head: not the LM
    embd = float(r.get("embd_pdrop", 0.0))
    if embd:
        r.note(f"embd_pdrop={embd}: pax_eqx has no embedding dropout (it acts in training only; logits are the same)")
    eps = float(r.get("layer_norm_epsilon", 1e-5))
    norm = LayerNormConfig(epsilon=eps, direct_scale=True)
    if not r.get("tie_word_embeddings", True):
        r.refuse("tie_word_embeddings", "GPT2LMHeadModel ties its output to the token embedding")
    block = TransformerConfig(
        norm_policy="pre",
        norm=norm,
        attention=AttentionConfig(use_bias=True, dropout_prob=float(r.get("attn_pdrop", 0.0))),
        activation=_activation(r, ("activation_function",), gated=False),
        ff_has_bias=True,
        residual_dropout_prob=float(r.get("resid_pdrop", 0.0)),
    )
    return LanguageModelConfig(
        vocab_size=r.need("vocab_size"), max_seq_len=positions, num_layers=r.need("n_layer"), model_dims=d,
        hidden_dims=r.get("n_inner", 4 * d if d else 0), num_heads=r.need("n_head"),
        position_embedding="trainable", separate_embedding=False, block=block, final_norm=norm,
    )  # fmt: skip
