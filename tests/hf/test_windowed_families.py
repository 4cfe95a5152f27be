"""The families that attend through a sliding window import with transformers' logits on
sequences longer than the window: Mistral's and Qwen2's `sliding_window` (every layer), Gemma 2
(alternating sliding and full layers, pre- and post-norms, query_pre_attn_scalar, attention and
final soft caps). The fixtures (tests/fixtures/hf, make.py) hold 12 tokens against windows of 5
and 4 and an 8-token prefill, so the forward, the prefill and each cached decode step all have
keys outside the window; each Gemma 2 option (and each window) moves transformers' logits far
past the tolerance (make.py's docstring: measured when written), so the match holds it. Then:
every config field read as transformers reads it, the layer patterns pax_eqx builds and those
it refuses by name, and the export round trip."""

import json

import numpy as np
import pytest
from hf_models import FIXTURES, WINDOWED, cached_logits, forward_logits, imported_model, reference

from pax_eqx import export_hf, import_hf
from pax_eqx.hf.families import HfConfigError, model_config
from pax_eqx.hf.safetensors_files import SafetensorsFiles
from pax_eqx.layers.attention_window import GlobalWindowConfig, SlidingWindowConfig

TOLERANCE = 1e-5


def _config(family: str) -> dict:
    return json.loads((FIXTURES / family / "config.json").read_text())


@pytest.mark.parametrize("family", WINDOWED)
def test_logits_equal_transformers_beyond_the_window(family):
    model, source = imported_model(FIXTURES / family)
    ref = reference(family)
    window = source.model.block.attention.window
    p, length = int(ref["prefix"]), ref["ids"].shape[1]
    assert window.kind == "sliding" and window.left_context < p < length  # keys outside the window at every step
    assert source.model.max_seq_len == _config(family)["max_position_embeddings"]
    np.testing.assert_allclose(forward_logits(model, ref["ids"]), ref["logits"], atol=TOLERANCE, rtol=0)
    prefill, steps = cached_logits(model, ref["ids"], p)
    np.testing.assert_allclose(prefill, ref["logits"][:, :p], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(steps, ref["cached"], atol=TOLERANCE, rtol=0)


def test_gemma2_config_maps_every_option():
    model, notes = model_config(_config("gemma2"))
    att = model.block.attention
    assert model.block.norm_policy == "primer_hybrid" and not model.block.norm.direct_scale
    assert (att.window, model.global_layer_interval) == (SlidingWindowConfig(left_context=4), 2)
    assert (att.logit_cap, model.soft_cap_logits, att.query_scale_dims) == (2.0, 5.0, 24.0)
    assert model.scale_embedding_sqrt_depth and not model.separate_embedding
    assert (model.block.activation.name, model.block.activation.gated) == ("gelu", True)
    assert notes == []


def _with(family: str, **changes) -> dict:
    cfg = _config(family)
    for name, value in changes.items():
        if value is None:
            cfg.pop(name, None)
        else:
            cfg[name] = value
    return cfg


S, F = "sliding_attention", "full_attention"


def test_layer_types_in_transformers_5_form_read_as_the_implicit_rule():
    """Gemma 2's published config.json has no layer_types (the fixture's); transformers 5 writes
    them out; Qwen2's max_window_layers is the older form of its list."""
    implicit, _ = model_config(_config("gemma2"))
    listed, _ = model_config(_with("gemma2", layer_types=[S, F, S, F]))
    assert listed == implicit
    every_fourth, _ = model_config(_with("gemma2", layer_types=[S, S, S, F]))
    assert every_fourth.global_layer_interval == 4
    qwen_listed, _ = model_config(_config("qwen2_window"))
    qwen_older, _ = model_config(_with("qwen2_window", layer_types=None))
    assert qwen_older == qwen_listed and qwen_listed.block.attention.window.left_context == 5
    none_slide, _ = model_config(_with("qwen2_window", layer_types=None, max_window_layers=2))
    assert none_slide.block.attention.window == GlobalWindowConfig()
    off, _ = model_config(_with("qwen2_window", layer_types=None, use_sliding_window=False))
    assert off.block.attention.window == GlobalWindowConfig()


@pytest.mark.parametrize(
    "family, changes, message",
    [
        (
            "gemma2",
            {"layer_types": [F, S, F, S]},
            r"layer_types: 4 layers, full attention at \[0, 2\], .* cannot build",
        ),
        ("gemma2", {"layer_types": [S, F, F, S]}, r"layer_types: 4 layers, full attention at \[1, 2\]"),
        ("gemma2", {"layer_types": [S, "chunked_attention", S, F]}, r"layer_types=.*each one of"),
        ("gemma2", {"num_hidden_layers": 3}, r"num_hidden_layers: 3 layers, full attention at \[1\]"),
        ("gemma2", {"attn_logit_softcapping": 0}, r"attn_logit_softcapping=0: a soft cap is a number > 0"),
        ("gemma2", {"sliding_window_size": 8}, r"sliding_window_size=8: an older name of sliding_window, which is 4"),
        ("gemma2", {"hidden_activation": "mish"}, r"hidden_activation='mish': an activation pax_eqx does not have"),
        ("qwen2_window", {"layer_types": None, "max_window_layers": 1}, r"max_window_layers: 2 layers, full .* \[0\]"),
        ("qwen2_window", {"use_sliding_window": False}, r"layer_types=.*use_sliding_window is false"),
        ("mistral_window", {"layer_types": [S, F]}, r"layer_types=.*MistralForCausalLM ignores it"),
        ("mistral_window", {"sliding_window": 0}, r"sliding_window=0: a window is a whole number of tokens >= 1"),
    ],
)
def test_patterns_pax_eqx_cannot_build_are_refused_by_name(family, changes, message):
    with pytest.raises(HfConfigError, match=message):
        model_config(_with(family, **changes))


def test_gemma2_fields_left_out_or_null_read_as_transformers_reads_them():
    """Absent: Gemma2Config's defaults (soft caps 50 and 30, query_pre_attn_scalar 256, window
    4096); null: no cap, no window. A query_pre_attn_scalar equal to the head dim is the usual scale."""
    absent, _ = model_config(
        _with("gemma2", attn_logit_softcapping=None, final_logit_softcapping=None, query_pre_attn_scalar=None,
              sliding_window=None, max_position_embeddings=8192)
    )  # fmt: skip
    att = absent.block.attention
    assert (att.logit_cap, absent.soft_cap_logits, att.query_scale_dims) == (50.0, 30.0, 256.0)
    assert att.window == SlidingWindowConfig(left_context=4096) and absent.global_layer_interval == 2
    null = _config("gemma2") | {"attn_logit_softcapping": None, "final_logit_softcapping": None, "sliding_window": None}
    off, _ = model_config(null | {"query_pre_attn_scalar": 16})
    assert (off.block.attention.logit_cap, off.soft_cap_logits, off.block.attention.query_scale_dims) == (0, 0, 0)
    assert off.block.attention.window == GlobalWindowConfig() and off.global_layer_interval == 0


def test_a_window_no_sequence_outgrows_is_global_with_a_note():
    """Mistral's default 4096 (absent from config.json) against a 64-token context: every key is
    within it, so the layers are global (the same keys) and the model keeps its 64 tokens."""
    for cfg in (_with("mistral_window", sliding_window=64), _with("mistral_window", sliding_window=None)):
        model, notes = model_config(cfg)
        assert model.block.attention.window == GlobalWindowConfig() and model.max_seq_len == 64
        assert "is not shorter than max_position_embeddings=64" in notes[0]
    null, notes = model_config(_config("mistral_window") | {"sliding_window": None})
    assert null.block.attention.window == GlobalWindowConfig() and notes == []


def test_gemma2_export_reimports_with_the_same_logits(tmp_path):
    """import_hf -> export_hf (float32): the same tensors (the stack of blocks written back row by
    layer) and config.json, which import again to transformers' logits."""
    job, out = tmp_path / "job", tmp_path / "out"
    assert import_hf.main([str(FIXTURES / "gemma2"), "--job-log-dir", str(job)]) == 0
    export_hf.export(job, out, dtype="float32")
    src, again = SafetensorsFiles.open(FIXTURES / "gemma2"), SafetensorsFiles.open(out)
    assert set(again.names()) == set(src.names())  # tied: no lm_head.weight in either
    for name in src.names():
        np.testing.assert_array_equal(np.asarray(again.read(name)), np.asarray(src.read(name)))
    written = json.loads((out / "config.json").read_text())
    assert {k: v for k, v in written.items() if "dtype" not in k} == {
        k: v for k, v in _config("gemma2").items() if "dtype" not in k
    }
    model, _ = imported_model(out)
    ref = reference("gemma2")
    np.testing.assert_allclose(forward_logits(model, ref["ids"]), ref["logits"], atol=TOLERANCE, rtol=0)


def test_transformers_loads_the_gemma2_export(tmp_path):
    """Optional: runs where transformers and torch are importable (never a test dependency)."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    job, out = tmp_path / "job", tmp_path / "hf"
    assert import_hf.main([str(FIXTURES / "gemma2"), "--job-log-dir", str(job)]) == 0
    export_hf.export(job, out, dtype="float32")
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    ref = reference("gemma2")
    with torch.no_grad():
        logits = model.eval()(torch.tensor(ref["ids"], dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(logits, ref["logits"], atol=TOLERANCE, rtol=0)
