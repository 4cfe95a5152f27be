"""export_hf: import -> export -> import again gives transformers' logits (float32 exactly the
weights; bfloat16 and shards as transformers writes them); and, where transformers and torch are
installed (never a test dependency), transformers itself loads the export with the same logits."""

import json

import numpy as np
import pytest
from hf_models import FIXTURES, forward_logits, imported_model, reference

from pax_eqx import export_hf, import_hf
from pax_eqx.config import ConfigError
from pax_eqx.hf.safetensors_files import INDEX_FILE, SafetensorsFiles


@pytest.fixture(scope="module")
def qwen_job(tmp_path_factory):
    job = tmp_path_factory.mktemp("qwen") / "job"
    assert import_hf.main([str(FIXTURES / "qwen2"), "--job-log-dir", str(job)]) == 0
    return job


def test_export_reimports_with_the_same_logits(qwen_job, tmp_path):
    out = tmp_path / "out"
    files = export_hf.export(qwen_job, out, dtype="float32", max_shard_bytes=60_000)  # several shards
    assert len(files) > 1 and (out / INDEX_FILE).is_file() and (out / "tokenizer.json").is_file()
    src, again = SafetensorsFiles.open(FIXTURES / "qwen2"), SafetensorsFiles.open(out)
    assert set(again.names()) == set(src.names()) - {"lm_head.weight"}  # tied: transformers re-ties on load
    for name in src.names():
        if name in again:
            np.testing.assert_array_equal(np.asarray(again.read(name)), np.asarray(src.read(name)))
    saved = json.loads((out / "config.json").read_text())
    assert saved["torch_dtype"] == "float32" and saved["model_type"] == "qwen2"
    model, _ = imported_model(out)
    ref = reference("qwen2")
    np.testing.assert_allclose(forward_logits(model, ref["ids"]), ref["logits"], atol=1e-5, rtol=0)


def test_bfloat16_export_holds_the_rounded_weights(qwen_job, tmp_path):
    import ml_dtypes

    out = tmp_path / "bf16"
    export_hf.export(qwen_job, out, dtype="bfloat16")
    files = SafetensorsFiles.open(out)
    name = "model.layers.1.self_attn.q_proj.bias"
    assert files.entries[name].dtype == np.dtype(ml_dtypes.bfloat16)
    want = np.asarray(SafetensorsFiles.open(FIXTURES / "qwen2").read(name)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(np.asarray(files.read(name)), want)


def test_export_refusals_name_the_problem(qwen_job, tmp_path):
    other = tmp_path / "other"  # not started by import_hf: its model's config.json is derived (test_export_trained)
    other.mkdir()
    (other / "config.json").write_text("{}")  # the default experiment, whose model has no sizes
    with pytest.raises(ConfigError, match="model.vocab_size must be > 0"):
        export_hf.export(other, tmp_path / "o1")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(ConfigError, match="is not empty"):
        export_hf.export(qwen_job, busy)
    with pytest.raises(ConfigError, match="is a file, not a directory"):  # it was a NotADirectoryError traceback
        export_hf.export(qwen_job, busy / "x")


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1", "five"])
def test_a_shard_size_that_cannot_work_is_one_line(value, tmp_path, capsys):
    """`--max-shard-gb nan` was a traceback; 0 was accepted (one tensor per file, any size)."""
    with pytest.raises(SystemExit) as info:
        export_hf.main(["--job-log-dir", str(tmp_path / "job"), "--out", str(tmp_path / "o"), "--max-shard-gb", value])
    assert info.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: argument --max-shard-gb: expected a finite number > 0, got") and value in line
    assert not (tmp_path / "o").exists()


def test_transformers_loads_the_export(qwen_job, tmp_path):
    """Optional: runs where transformers and torch are importable (never a test dependency)."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    out = tmp_path / "hf"
    export_hf.export(qwen_job, out, dtype="float32")
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ref = reference("qwen2")
    with torch.no_grad():
        logits = model(torch.tensor(ref["ids"], dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(logits, ref["logits"], atol=1e-5, rtol=0)
