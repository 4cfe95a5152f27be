"""The experiments from the command line, their data, and docs/experiments.md kept honest."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from pax_table import ALL, pax_param_count

from experiments import registry
from pax_eqx import train
from pax_eqx.config import switch_variant
from pax_eqx.data import SyntheticSource, build_input, build_tokenizer
from pax_eqx.data.tokenizers import ByteTokenizer

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "experiments.md").read_text()


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = train.main(list(argv))
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


# Command line --------------------------------------------------------------------------------
def test_pax_alias_dry_run_on_the_command_line(capsys):
    """No data flags: planning reads no data files (C4 is not on this machine)."""
    code, out, _ = run_main(capsys, "--exp", "C4Spmd1BAdam4Replicas", "--dry-run")
    assert code == 0
    assert "Dry run of c4_spmd_1b_adam_4replicas: mesh (data, fsdp, tensor) = (1, 4, 1)" in out
    assert "Parameters: 1,104,619,904 (1.10 B)" in out


def test_dry_run_that_does_not_fit_exits_1_so_a_launch_script_can_stop(capsys):
    code, out, _ = run_main(capsys, "--exp", "lm_cloud_spmd_2b", "--dry-run", "--dry-run-device-memory-gb", "1")
    assert code == 1 and "Verdict: does NOT fit in 1 GiB per device." in out
    code, out, _ = run_main(capsys, "--exp", "lm_cloud_spmd_test", "--dry-run", "--dry-run-device-memory-gb", "80")
    assert code == 0 and "Verdict: fits in 80 GiB per device." in out
    assert re.search(r"Parameters: [\d,]+ \(\d+\.\d\d M\)", out)  # a small model is not "0.00 B"


@pytest.mark.parametrize("name, extra", [("lm_cloud_spmd_1024b", []), ("c4_gpt3_175b", [])])
def test_the_largest_experiments_plan_in_seconds(capsys, name, extra):
    start = time.perf_counter()
    code, out, _ = run_main(capsys, "--exp", name, "--dry-run", "--dry-run-device-memory-gb", "95", *extra)
    assert "Verdict:" in out and code == (1 if "does NOT fit" in out else 0)
    assert time.perf_counter() - start < 10.0


def test_c4_without_data_path_stops_before_writing_and_names_the_field(tmp_path):
    """A real process on 4 CPU devices (the experiment's mesh), so the data check is what fails."""
    job = tmp_path / "job"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    cmd = [sys.executable, "-m", "pax_eqx.train", "--exp", "c4_spmd_1b_adam_4replicas", "--job-log-dir", str(job)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "data.path" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not job.exists()


def documented_dry_runs() -> list[tuple[str, list[str], int]]:
    """Every `python -m pax_eqx.train ... --dry-run` command in README.md and docs/*.md, with the
    exit status its comment promises (1 when the comment starts with `exit 1`)."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            command, _, comment = line.partition("#")
            if command.startswith("python -m pax_eqx.train") and "--dry-run" in command:
                found.append((path.name, command.split()[3:], 1 if comment.strip().startswith("exit 1") else 0))
    return found


@pytest.mark.parametrize("doc, argv, expected", documented_dry_runs(), ids=lambda v: v if isinstance(v, str) else "")
def test_documented_dry_run_commands_work(capsys, doc, argv, expected):
    code, out, err = run_main(capsys, *argv)
    assert code == expected, (doc, argv, err)
    assert "Dry run of" in out


def test_data_synthetic_true_is_data_source_synthetic(capsys):
    from pax_eqx.command_line import cli

    exp, _, _ = cli.parse(
        ["--exp", "c4_spmd_1b_adam_4replicas", "--data.synthetic", "true"], "t", "", job_dir_required=False
    )
    assert exp.data.source.kind == "synthetic"
    exp, _, _ = cli.parse(
        ["--exp", "c4_spmd_1b_adam_4replicas", "--data.synthetic", "false"], "t", "", job_dir_required=False
    )
    assert exp.data.source.kind == "jsonl"
    with pytest.raises(SystemExit) as e:
        cli.parse(["--exp", "c4_spmd_1b_adam_4replicas", "--data.synthetic", "maybe"], "t", "", job_dir_required=False)
    assert e.value.code == 2
    assert "--data.synthetic 'maybe' is not a boolean" in capsys.readouterr().err


# Data ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, batch", [("c4_spmd_1b_adam_4replicas", 128), ("lm_cloud_spmd_2b", 32)])
def test_synthetic_rows_are_paxs_synthetic_lm_data(name, batch):
    """Pax's SyntheticLmData: ids = labels = 1, weights 1, one segment, positions 0..seq-1."""
    exp = registry.load_experiment(name)
    synthetic = switch_variant(exp.data.source, SyntheticSource)  # `--data.source synthetic` alone
    exp = exp.replace(data=exp.data.replace(source=synthetic))
    exp.validate()
    tokenizer = build_tokenizer(exp.data)  # C4's SentencePiece has no text here: bytes print samples
    assert isinstance(tokenizer, ByteTokenizer)
    for split in ("train", "eval"):
        rows = build_input(exp.data, split, tokenizer, num_infeed_hosts=1, infeed_host_index=0).get_next()
        assert {k: v.shape for k, v in rows.items()} == {
            k: (batch, 1024) for k in ("ids", "labels", "weights", "segment_ids", "segment_pos")
        }
        for key in ("ids", "labels", "weights", "segment_ids"):
            assert np.all(rows[key] == 1), key
        np.testing.assert_array_equal(rows["segment_pos"], np.broadcast_to(np.arange(1024), (batch, 1024)))


# docs/experiments.md --------------------------------------------------------------------------
def doc_rows() -> dict[str, list[str]]:
    rows = {}
    for line in DOC.splitlines():
        match = re.match(r"\| `(\w+)` \|(.*)\|$", line)
        if match:
            rows[match.group(1)] = [c.strip() for c in match.group(2).split("|")]
    return rows


def count(text: str) -> float:
    number, unit = float(text[:-1]), text[-1]
    return number * {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}[unit]


def test_doc_table_has_every_registered_experiment_and_nothing_else():
    assert sorted(doc_rows()) == registry.names()


@pytest.mark.parametrize("name", [r.name for r in ALL])
def test_doc_table_row_matches_the_experiment(name):
    alias, params, shape, vocab, seq, batch, mesh, dtype, data = doc_rows()[name]
    exp = registry.load_experiment(name)
    m = exp.model
    assert registry.load_experiment(alias) == exp
    assert shape == f"{m.num_layers} / {m.model_dims} / {m.num_heads}x{m.dim_per_head}"
    assert (int(vocab), int(seq), int(batch)) == (m.vocab_size, exp.data.seq_len, exp.data.train.batch_size)
    dcn = f" x {exp.mesh.dcn_mesh_shape}" if set(exp.mesh.dcn_mesh_shape) != {1} else ""
    assert mesh == f"{exp.mesh.ici_mesh_shape}{dcn}"
    assert dtype == exp.train.fprop_dtype
    assert data == ("synthetic" if exp.data.source.kind == "synthetic" else "C4 (jsonl)")
    row = next(r for r in ALL if r.name == name)
    assert count(params) == pytest.approx(pax_param_count(row), rel=0.006)


def test_doc_user_module_example_runs_by_dotted_path(tmp_path, capsys, monkeypatch):
    block = re.search(r"```python\n(# mypkg/mymodule\.py\n.*?)```", DOC, re.S).group(1)
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mymodule.py").write_text(block)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        exp = registry.load_experiment("mypkg.mymodule.my_exp")
        assert (exp.name, exp.model.num_layers, exp.model.model_dims, exp.learner.learning_rate) == (
            "my_exp", 4, 128, 1e-3,
        )  # fmt: skip
        assert exp.train.num_steps == 500 and exp.data.source.kind == "synthetic"
        code, out, _ = run_main(capsys, "--exp", "mypkg.mymodule.my_small_gpt", "--dry-run")
        assert code == 0 and "Dry run of my_small_gpt" in out
        small = registry.load_experiment("mypkg.mymodule.my_small_gpt")
        assert (small.model.num_layers, small.model.model_dims, small.train.num_steps) == (12, 768, 1000)
    finally:
        for mod in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
            del sys.modules[mod]
