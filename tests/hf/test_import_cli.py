"""The command line, end to end, as a user runs it: import a Hugging Face directory into a job dir,
decode text from it, fine-tune it on a JSONL file; and the refusals that leave nothing behind."""

import json
import os
import subprocess
import sys

from hf_models import FIXTURES

ENV = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu"}
LINES = [
    "Now is the winter of our discontent made glorious summer by this sun of York;",
    "And all the clouds that lour'd upon our house in the deep bosom of the ocean buried.",
    "Grim-visaged war hath smooth'd his wrinkled front; and now, instead of mounting barded steeds",
]


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=ENV, timeout=600)


def test_import_decode_and_fine_tune_through_the_cli(tmp_path):
    """Imported with its defaults, then fine-tuned as the issue asks: `train --job-log-dir DIR`
    without --exp reads the saved experiment, and the user's data and another optimizer are
    taken (the step-0 import is a start point: its parameters, a fresh learner state)."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": line}) + "\n" for line in LINES * 8))
    job = tmp_path / "job"
    out = _run("pax_eqx.import_hf", str(FIXTURES / "llama"), "--job-log-dir", str(job), "--data.seq-len", "16")
    assert out.returncode == 0, out.stderr
    assert "Imported llama" in out.stdout and (job / "tokenizer" / "tokenizer.json").is_file()
    saved = json.loads((job / "config.json").read_text())
    assert saved["data"]["tokenizer"]["kind"] == "tokenizer_json" and saved["model"]["num_kv_heads"] == 2
    assert saved["learner"]["optimizer"]["kind"] != "sgd" and saved["data"]["source"]["kind"] != "jsonl"

    out = _run("pax_eqx.decode", "--job-log-dir", str(job), "--prompt", "Now is the", "--max-new-tokens", "6")
    assert out.returncode == 0, out.stderr
    assert "Now is the" in out.stdout and "step 0" in out.stdout

    data = ["--data.source", "jsonl", "--data.path", str(corpus), "--data.train.batch-size", "2",
            "--data.eval.batch-size", "2"]  # fmt: skip
    out = _run(
        "pax_eqx.train", "--job-log-dir", str(job), *data, "--learner.optimizer", "sgd", "--train.num-steps", "2",
        "--train.eval-interval-steps", "2", "--train.no-sample-at-end",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"Loading experiment {job / 'config.json'}" in out.stdout
    assert "Fine-tuning" in out.stdout and "imported step-0 checkpoint" in out.stdout
    assert "learner.optimizer.kind: " in out.stdout and "data.source.kind: " in out.stdout, out.stdout  # the changes
    assert (job / "checkpoints" / "2").is_dir()
    fine_tuned = json.loads((job / "config.json").read_text())
    source = fine_tuned["data"]["source"]
    assert fine_tuned["learner"]["optimizer"]["kind"] == "sgd"
    assert (source["kind"], source["path"]) == ("jsonl", str(corpus))

    out = _run("pax_eqx.train", "--job-log-dir", str(job), "--learner.optimizer", "adam", "--train.num-steps", "3")
    assert out.returncode == 2 and "learner.optimizer" in out.stderr  # past step 0 it resumes: no learner change


def test_a_refused_import_writes_nothing(tmp_path):
    """In process (the exit status of a ConfigError is entry.run's, tested for every program)."""
    import shutil

    import pytest

    from pax_eqx import import_hf
    from pax_eqx.hf.families import HfConfigError

    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "gpt2", src)
    cfg = json.loads((src / "config.json").read_text()) | {"n_ctx": 32}
    (src / "config.json").write_text(json.dumps(cfg))
    job = tmp_path / "job"
    with pytest.raises(HfConfigError, match="n_ctx=32: it differs from n_positions=64"):
        import_hf.main([str(src), "--job-log-dir", str(job)])
    assert not job.exists()


def test_a_safetensors_file_cut_short_is_named_and_the_job_dir_is_not_left_behind(tmp_path):
    """An interrupted download: it was numpy's `ValueError: mmap length is greater than file size`
    traceback in the middle of the import, and a half-written job dir."""
    import os
    import shutil

    import pytest

    from pax_eqx import import_hf
    from pax_eqx.hf.safetensors_files import HfCheckpointError

    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "llama", src)
    os.truncate(src / "model.safetensors", 5000)
    job = tmp_path / "job"
    with pytest.raises(HfCheckpointError, match=r"model.safetensors' is cut short: tensor .* of a 5,000-byte file"):
        import_hf.main([str(src), "--job-log-dir", str(job)])
    assert not job.exists()
