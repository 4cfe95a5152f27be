"""export_hf of a model trained here (no import_hf): tiny Llama- and GPT-2-shaped models trained two
steps through the train CLI, exported in float32, read back by the importer with the same logits;
the byte tokenizer exported as a tokenizer.json giving the same ids; shakespeare_char's default,
which no family has, refused in one line naming the field; and, where transformers and torch are
installed (never a test dependency), transformers itself loads the export with the same logits.

The GPT-2-shaped model is shakespeare_char with learned positions: it has what the export must
convert on the way out (a listed stack, a fused w_qkv, LayerNorm scales stored as offsets from
one, no biases), so these tests cover the conversions as well as the plain layout (the Llama's
scanned stack with grouped-query heads and an untied softmax)."""

import json

import numpy as np
import pytest
from hf_models import forward_logits, imported_model

from pax_eqx import export_hf, train
from pax_eqx.command_line import entry
from pax_eqx.data.tokenizers import ByteTokenizer
from pax_eqx.hf.config_from_model import hf_export

TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\n"
# Two steps at a learning rate that moves every weight (norm scales included) off its init.
TINY = [
    "--model.num-layers", "2", "--model.model-dims", "32", "--model.num-heads", "4", "--data.seq-len", "16",
    "--train.num-steps", "2", "--train.steps-per-loop", "1", "--train.no-sample-at-end",
    "--data.eval.eval-loop-num-batches", "1", "--learner.learning-rate", "1e-2",
    "--learner.schedule.warmup-steps", "0",
]  # fmt: skip
SHAPES = {
    # Llama: scanned stack, grouped-query attention (4 query heads, 2 kv heads), untied softmax.
    "llama": ["--exp", "shakespeare_char_llama", "--model.hidden-dims", "48", "--model.num-kv-heads", "2",
              "--model.repeat", "--model.separate-embedding"],
    # GPT-2: shakespeare_char (listed stack, fused qkv, offset LayerNorm, no biases) with learned positions.
    "gpt2": ["--exp", "shakespeare_char", "--model.hidden-dims", "64", "--model.position-embedding", "trainable"],
}  # fmt: skip


def _mesh_args():
    import jax

    n = str(jax.device_count())
    return ["--mesh.ici-mesh-shape", n, "1", "1", "--data.train.batch-size", n, "--data.eval.batch-size", n]


@pytest.fixture(scope="module", params=sorted(SHAPES))
def exported(request, tmp_path_factory):
    """(family, the trained job dir, its float32 export, what export_hf printed)."""
    family = request.param
    root = tmp_path_factory.mktemp(family)
    job, out = root / "job", root / "hf"
    assert train.main([*SHAPES[family], *TINY, *_mesh_args(), "--job-log-dir", str(job)]) == 0
    import io
    from contextlib import redirect_stdout

    printed = io.StringIO()
    with redirect_stdout(printed):
        assert export_hf.main(["--job-log-dir", str(job), "--out", str(out), "--dtype", "float32"]) == 0
    return family, job, out, printed.getvalue()


def _trained_logits(job, ids):
    """The logits the job's own model computes from its newest checkpoint (as eval and decode load it)."""
    from pax_eqx.checkpoint import Checkpointer
    from pax_eqx.experiment import ExperimentConfig
    from pax_eqx.programs.compiled import Programs
    from pax_eqx.programs.lora_base import restore_state
    from pax_eqx.programs.runtime import build_task
    from pax_eqx.sharding.mesh import build_mesh

    exp = ExperimentConfig.from_dict(json.loads((job / "config.json").read_text()))
    programs = Programs(build_task(exp), build_mesh(exp.mesh), exp.mesh.rules)
    ckpt = Checkpointer(job / "checkpoints", exp.checkpoint, read_only=True)
    restored, state, _ = restore_state(ckpt, programs, exp, job, None, restore_data=False)
    ckpt.close()
    assert restored == 2
    return forward_logits(programs.task.model(programs.task.inference_params(state)), ids)


def _ids():
    ids = np.array(ByteTokenizer().encode(TEXT)[:32]).reshape(2, 16)
    return ids


def test_the_export_reimports_with_the_same_logits(exported):
    family, job, out, printed = exported
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == family and config["torch_dtype"] == "float32"
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (2, 3, 0)
    assert "Tokenizer: the byte tokenizer as a byte-level tokenizer.json" in printed
    model, source = imported_model(out)
    assert source.family == family and source.specials == {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    ids = _ids()
    np.testing.assert_allclose(forward_logits(model, ids), _trained_logits(job, ids), atol=1e-5, rtol=0)


def test_the_exported_config_reimports_to_the_same_model(exported):
    """The round trip hf_export checks, from the written file: the model import_hf would build is
    the trained one but for the layout the export changed (stacked, unfused, +1 scales, zero biases)."""
    family, job, out, _ = exported
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
    _, _, out, _ = exported
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
    _, job, out, _ = exported
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = _ids()
    with torch.no_grad():
        logits = model(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(logits, _trained_logits(job, ids), atol=1e-5, rtol=0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer(TEXT)["input_ids"] == ByteTokenizer().encode(TEXT)
