"""Each family imports with transformers' logits (tests/fixtures/hf, written by make.py with
transformers and torch; read here with safetensors headers and numpy only): the whole-sequence
forward, the KV-cache prefill and the one-token decode steps, all within 1e-5 in float32."""

import json
import shutil

import jax
import numpy as np
import pytest
from hf_models import FAMILIES, FIXTURES, WINDOWED, cached_logits, forward_logits, imported_model, reference

from pax_eqx.hf.families import HfConfigError
from pax_eqx.hf.importer import HfSource
from pax_eqx.hf.safetensors_files import SafetensorsFiles
from pax_eqx.hf.weights import hf_name_in
from pax_eqx.layers.rotary_scaling import NoRotaryScalingConfig
from pax_eqx.learners.variables import path_name

TOLERANCE = 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers(family):
    model, _ = imported_model(FIXTURES / family)
    ref = reference(family)
    p = int(ref["prefix"])
    assert np.abs(ref["logits"]).max() > 1.0  # random weights large enough that a wrong mapping shows
    np.testing.assert_allclose(forward_logits(model, ref["ids"]), ref["logits"], atol=TOLERANCE, rtol=0)
    prefill, steps = cached_logits(model, ref["ids"], p)
    np.testing.assert_allclose(prefill, ref["logits"][:, :p], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(steps, ref["cached"], atol=TOLERANCE, rtol=0)


def test_llama3_fixture_depends_on_its_rope_scaling():
    """The fixture's frequencies are scaled (original_max_position 16), so the match above holds
    the llama3 scaling to transformers'; without it the logits move far past the tolerance."""
    source = HfSource.open(FIXTURES / "llama3")
    assert source.model.block.attention.rotary_scaling.kind == "llama3"
    plain = source.model.replace(
        block=source.model.block.replace(
            attention=source.model.block.attention.replace(rotary_scaling=NoRotaryScalingConfig())
        )
    )
    model, _ = imported_model(FIXTURES / "llama3", plain)
    ref = reference("llama3")
    assert np.abs(forward_logits(model, ref["ids"]) - ref["logits"]).max() > 100 * TOLERANCE


@pytest.mark.parametrize("family", FAMILIES + WINDOWED)
def test_each_conversion_is_exactly_inverted(family):
    """to_hf(to_pax(tensor)) == tensor for every tensor of the checkpoint: the export's layout."""
    source = HfSource.open(FIXTURES / family)
    abstract = jax.eval_shape(lambda: source.model.build(jax.random.PRNGKey(0)))
    ours = [path_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(abstract)[0]]
    plan = source.plan(source.model, ours)
    names, checked = set(source.files.names()), set()
    for entry in plan.entries:
        for name in plan.hf_names(entry):
            found = hf_name_in(names, name, family)
            tensor = np.asarray(source.files.read(found))
            np.testing.assert_array_equal(entry.to_hf(entry.to_pax(tensor)), tensor)
            checked.add(found)
    assert names - checked <= {"lm_head.weight"}  # every tensor (a tied model's copy of the embedding aside)


def _copy(tmp_path, family):
    out = tmp_path / family
    shutil.copytree(FIXTURES / family, out)
    return out


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "family, changes, message",
    [
        ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"rope_scaling=.*rope_type 'yarn'"),
        ("llama", {"frobnicate": 3}, r"frobnicate=3: pax_eqx.import_hf does not know this field"),
        (
            "qwen2",
            {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1, "layer_types": None},
            r"max_window_layers: 2 layers, full attention at \[0\], .* cannot build this pattern",
        ),
        ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, r"scale_attn_by_inverse_layer_idx=True"),
        ("gemma", {"hidden_act": "mish"}, r"hidden_act='mish': an activation pax_eqx does not have"),
        ("llama", {"quantization_config": {"quant_method": "gptq"}}, r"quantization_config=.*unquantized"),
        ("mistral", {"model_type": "mixtral"}, r"model_type='mixtral' is not one of"),
    ],
)
def test_config_fields_pax_eqx_cannot_honour_are_refused_by_name(tmp_path, family, changes, message):
    src = _copy(tmp_path, family)
    _edit_config(src, **changes)
    with pytest.raises(HfConfigError, match=message):
        HfSource.open(src)


def test_tensors_that_do_not_fit_are_listed(tmp_path):
    from safetensors.numpy import save_file

    src = _copy(tmp_path, "llama")
    tensors = {n: np.asarray(SafetensorsFiles.open(src).read(n)) for n in SafetensorsFiles.open(src).names()}
    del tensors["model.layers.1.mlp.up_proj.weight"]
    tensors["model.layers.0.self_attn.extra.weight"] = np.zeros((2, 2), np.float32)
    save_file(tensors, str(src / "model.safetensors"))
    source = HfSource.open(src)
    with pytest.raises(HfConfigError) as e:
        imported_model(src)
    assert "model.layers.1.mlp.up_proj.weight (for stack.layers.ff_in.linear.w) is not in the checkpoint" in str(
        e.value
    )
    assert "model.layers.0.self_attn.extra.weight is not used by this model" in str(e.value)
    assert source.family == "llama"


def test_bfloat16_checkpoints_are_read(tmp_path):
    """The published checkpoints are bfloat16, which the safetensors package's numpy reader cannot return."""
    import ml_dtypes
    from safetensors.numpy import save_file

    src = _copy(tmp_path, "gpt2")
    files = SafetensorsFiles.open(src)
    save_file(
        {n: np.asarray(files.read(n)).astype(ml_dtypes.bfloat16) for n in files.names()}, str(src / "model.safetensors")
    )
    model, _ = imported_model(src)
    wte = np.asarray(SafetensorsFiles.open(FIXTURES / "gpt2").read("transformer.wte.weight"))
    np.testing.assert_array_equal(np.asarray(model.embedding.w), wte.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_a_directory_without_tokenizer_json_is_refused_with_the_fix(tmp_path):
    from pax_eqx.config import MissingFileError

    src = _copy(tmp_path, "gpt2")
    (src / "tokenizer.json").unlink()
    (src / "tokenizer.model").write_bytes(b"spm")
    with pytest.raises(MissingFileError, match=r"no tokenizer.json \(it has tokenizer.model: .*save_pretrained"):
        HfSource.open(src)
