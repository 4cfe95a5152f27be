"""export_hf of a model trained here (no import_hf): tiny Llama- and GPT-2-shaped models trained two
steps through the train CLI and exported in float32 (`trained_for_export.py`, one process of its
own), read back by the importer with the logits the trained models compute; the byte tokenizer
exported as a tokenizer.json giving the same ids; shakespeare_char's default, which no family
has, refused in one line naming the field; and, where transformers and torch are installed
(never a test dependency), transformers itself loads the exports with the same logits."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hf_models import forward_logits, imported_model
from trained_for_export import ENV, SHAPES, TEXT, token_ids

from pax_eqx import export_hf
from pax_eqx.command_line import entry
from pax_eqx.data.tokenizers import ByteTokenizer
from pax_eqx.hf.config_from_model import hf_export

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """ROOT of trained_for_export.py's jobs, exports and reference logits."""
    root = tmp_path_factory.mktemp("trained")
    script = HERE / "trained_for_export.py"
    env = {**os.environ, **ENV}
    proc = subprocess.run(
        [sys.executable, str(script), str(root)], env=env, cwd=HERE.parents[1], capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


@pytest.fixture(params=sorted(SHAPES))
def exported(request, trained):
    """(family, the trained job dir, its float32 export, what train and export_hf printed, the
    trained model's logits of token_ids())."""
    family, root = request.param, trained
    logits = np.load(root / f"{family}_logits.npy")
    return family, root / family, root / f"{family}_hf", (root / f"{family}.log").read_text(), logits


def test_the_export_reimports_with_the_same_logits(exported):
    family, _, out, printed, logits = exported
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == family and config["torch_dtype"] == "float32"
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (2, 3, 0)
    assert "Tokenizer: the byte tokenizer as a byte-level tokenizer.json" in printed
    model, source = imported_model(out)
    assert source.family == family
    assert source.specials == {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    np.testing.assert_allclose(forward_logits(model, token_ids()), logits, atol=1e-5, rtol=0)


def test_the_exported_config_reimports_to_the_same_model(exported):
    """The round trip hf_export checks, from the written file: the model import_hf would build is
    the trained one but for the layout the export changed (stacked, unfused, +1 scales, zero biases)."""
    family, job, out, _, _ = exported
    from pax_eqx.experiment import ExperimentConfig
    from pax_eqx.hf.families import model_config

    trained = ExperimentConfig.from_dict(json.loads((job / "config.json").read_text())).model
    back, notes = model_config(json.loads((out / "config.json").read_text()))
    assert notes == []
    assert (back.num_layers, back.model_dims, back.num_heads, back.vocab_size) == (2, 32, 4, 260)
    if family == "llama":
        assert back.num_kv_heads == 2 and back.separate_embedding and back.hidden_dims == 48
        assert back.block == trained.block and back.final_norm == trained.final_norm
    else:
        assert back.position_embedding == "trainable" and not back.separate_embedding
        assert back.block.activation == trained.block.activation  # gelu_exact: GPT-2's "gelu"
        assert back.block.norm.direct_scale and back.block.attention.use_bias and back.block.ff_has_bias


def test_the_byte_tokenizer_exports_as_a_tokenizer_json_with_the_same_ids(exported):
    tokenizers = pytest.importorskip("tokenizers")
    _, _, out, _, _ = exported
    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    ours = ByteTokenizer()
    for text in (TEXT, "naïve café — 東京 🎭", "tabs\tand  spaces \n\n"):
        ids = tok.encode(text).ids
        assert ids == ours.encode(text)
        assert tok.decode(ids) == ours.decode(ids) == text
    assert tok.decode([2, *ours.encode("ab"), 3, 0]) == "ab"  # specials dropped, as pax_eqx's decode does
    assert json.loads((out / "tokenizer_config.json").read_text())["eos_token"] == "</s>"


def test_shakespeare_char_is_refused_in_one_line_naming_the_norm(tmp_path, capsys, entry_hooks_restored):
    """The default experiment: LayerNorm with rotary positions, which no Hugging Face family has."""
    from experiments.registry import load_experiment

    job = tmp_path / "job"
    job.mkdir()
    (job / "config.json").write_text(json.dumps(load_experiment("shakespeare_char").to_dict()))
    with pytest.raises(SystemExit) as info:
        entry.run(lambda: export_hf.main(["--job-log-dir", str(job), "--out", str(tmp_path / "out")]))
    assert info.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: model maps to no Hugging Face family export_hf writes: model.block.norm is ")
    assert "layer_norm but model.position_embedding='rotary'" in line and "shakespeare_char_llama" in line
    assert not (tmp_path / "out").exists()


def test_a_field_no_family_has_is_named_with_the_familys_value():
    """Past the deciding fields, every other one is checked by the round trip: a logit cap and an
    ungated feed-forward in a Llama-shaped model are both named."""
    from experiments.registry import load_experiment
    from pax_eqx.config import ConfigError
    from pax_eqx.layers import ActivationConfig

    model = load_experiment("shakespeare_char_llama").model
    block = model.block.replace(activation=ActivationConfig(name="silu"))
    with pytest.raises(ConfigError) as info:
        hf_export(model.replace(block=block, soft_cap_logits=30.0))
    message = str(info.value)
    assert "make it llama, but llama has model.block.activation.gated=True (this model: False)" in message
    assert "model.soft_cap_logits=0.0 (this model: 30.0)" in message and "\n" not in message


def test_transformers_loads_the_export(exported):
    """Optional: runs where transformers and torch are importable (never a test dependency)."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    _, _, out, _, logits = exported
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = model(torch.tensor(token_ids(), dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(theirs, logits, atol=1e-5, rtol=0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer(TEXT)["input_ids"] == ByteTokenizer().encode(TEXT)
