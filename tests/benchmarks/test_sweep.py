"""`benchmarks.sweep`: a list of MFU runs that survives failures and cut-offs, ending in one table.

Driven as a user on a GPU lease would, shrunk to CPU: benchmarks/sweeps/cpu_smoke.txt has two
toy gpt3_xl variants and one that fails (a mesh that does not match the devices); the end-to-end
sweep runs one of each kind.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import sweep

SMOKE = Path(__file__).resolve().parents[2] / "benchmarks" / "sweeps" / "cpu_smoke.txt"
FAST = ["--steps", "1", "--warmup", "1", "--no-reference"]
RESULT = {
    "tokens_per_step": 128, "step_time_s": 0.01, "tokens_per_s": 12800.0, "mfu": 0.01, "hfu": 0.01,
    "reference_step_time_s": None, "ratio_to_reference": None, "peak_mem_gb": None, "temp_mem_gb": 0.01,
    "compile_s": 3.0,
}  # fmt: skip


def test_a_sweep_records_each_variant_continues_past_a_failure_and_resumes(tmp_path, capsys):
    # cpu_smoke.txt's first variant, which runs, and its last, which fails (its second toy variant
    # would only compile another remat policy: every line is checked by the last test below).
    smoke = sweep.read_variants(SMOKE)
    variants = tmp_path / "variants.txt"
    variants.write_text(f"{smoke[0]}\n# fails\n{smoke[-1]}\n")
    out = tmp_path / "sweep" / "results.jsonl"
    assert sweep.main(["--variants", str(variants), "--out", str(out), *FAST]) == 0
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["variant"] for r in results] == [smoke[0], smoke[-1]]
    good, bad = results
    assert good["exp"] == "gpt3_xl" and good["step_time_s"] > 0 and good["tokens_per_step"] == 8 * 16
    assert bad["error"].startswith("exit 2: error: mesh.ici_mesh_shape (3, 1, 1)")
    printed = capsys.readouterr().out
    table = [line for line in printed.splitlines() if line.startswith("|")]
    assert len(table) == 2 + 2 and "failed: exit 2" in table[-1] and "failed" not in table[-2]

    # Run again: everything is recorded, so nothing runs and the same table comes back.
    assert sweep.main(["--variants", str(variants), "--out", str(out), *FAST]) == 0
    again = capsys.readouterr().out
    assert "[1/" not in again and [line for line in again.splitlines() if line.startswith("|")] == table
    assert len(out.read_text().splitlines()) == 2


def test_a_spent_budget_starts_nothing_and_says_how_many_are_left(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    assert sweep.main(["--variants", str(SMOKE), "--out", str(out), "--budget-s", "0", *FAST]) == 0
    assert "3 variants left; run again to continue" in capsys.readouterr().out
    assert not out.exists() or out.read_text() == ""


def test_a_line_torn_by_a_kill_is_ignored_so_its_variant_runs_again(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text(json.dumps({"variant": "--exp a", "step_time_s": 1.0}) + '\n{"variant": "--exp b", "st')
    assert [r["variant"] for r in sweep.load_results(out)] == ["--exp a"]


def test_variant_lines_split_into_environment_and_arguments(tmp_path):
    f = tmp_path / "v.txt"
    f.write_text(
        "# a comment\n\n  --exp a   --x 1  # trailing\nXLA_FLAGS='--a=1 --b' FOO=2 --exp gpt3_xl --model.unroll 2\n"
    )
    plain, with_env = sweep.read_variants(f)
    assert plain == "--exp a --x 1"
    env, args = sweep.split_env(with_env)  # the quotes survive reading: two flags stay one value
    assert env == {"XLA_FLAGS": "--a=1 --b", "FOO": "2"} and args == ["--exp", "gpt3_xl", "--model.unroll", "2"]


def test_the_result_is_the_last_json_object_printed_even_with_logging_after_it():
    assert sweep.last_json_object('summary\n{"mfu": 0.5}\nW1123 some log line\n') == {"mfu": 0.5}
    assert sweep.last_json_object("[1, 2]\nno json here\n") is None


def test_timed_out_variants_and_other_mfu_flags_run_again(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    variants = sweep.read_variants(SMOKE)
    records = [
        {"variant": variants[0], "mfu_flags": FAST, **RESULT},
        {"variant": variants[1], "mfu_flags": FAST, "error": "timed out after 300 s"},
        {"variant": variants[2], "mfu_flags": FAST, "error": "exit 2: error: mesh"},
    ]
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    sweep.main(["--variants", str(SMOKE), "--out", str(out), "--budget-s", "0", *FAST])
    assert "1 variants left" in capsys.readouterr().out  # only the timed-out one: failures are results
    sweep.main(["--variants", str(SMOKE), "--out", str(out), "--budget-s", "0", "--steps", "3"])
    assert "3 variants left" in capsys.readouterr().out  # other mfu flags: other results


def test_a_missing_or_empty_variants_file_is_one_clear_error(tmp_path, capsys):
    assert sweep.main(["--variants", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "r.jsonl")]) == 2
    assert "--variants" in capsys.readouterr().err and not (tmp_path / "r.jsonl").exists()
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n")
    assert sweep.main(["--variants", str(empty), "--out", str(tmp_path / "r.jsonl")]) == 2
    assert "has no command line" in capsys.readouterr().err


def test_every_line_of_the_shipped_sweeps_is_a_valid_experiment():
    """A typo in a sweep costs GPU time on a lease: each line must parse and validate here."""
    from pax_eqx.command_line import cli

    for path in sorted(SMOKE.parent.glob("*.txt")):
        for variant in sweep.read_variants(path):
            env, args = sweep.split_env(variant)
            exp, _, _ = cli.parse(args, "t", "", job_dir_required=False)
            mesh = exp.mesh.ici_mesh_shape
            if path != SMOKE:  # the GPU sweeps run on one device
                exp.validate(num_devices=1)
                assert mesh == (1, 1, 1), f"{path.name}: {variant}"
            assert set(env) <= {"XLA_FLAGS"}, f"{path.name}: {variant}"


def test_confirm_best_runs_the_line_of_highest_mfu_again_beside_the_reference(tmp_path, monkeypatch, capsys):
    """A lease sweeps without the reference (half the time), then times only the winner beside it."""
    calls = []

    def fake_run(variant, mfu_flags, timeout_s):
        calls.append((variant, mfu_flags))
        mfu = {"--exp a": 0.40, "--exp b": 0.55, "--exp c": 0.50}[variant]
        reference = None if "--no-reference" in mfu_flags else 0.01
        return {"variant": variant, "mfu_flags": mfu_flags, **RESULT, "mfu": mfu, "wall_s": 1.0,
                "reference_step_time_s": reference, "ratio_to_reference": reference and 1.0}  # fmt: skip

    monkeypatch.setattr(sweep, "run_variant", fake_run)
    variants = tmp_path / "v.txt"
    variants.write_text("--exp a\n--exp b\n--exp c\n")
    out = tmp_path / "r.jsonl"
    args = ["--variants", str(variants), "--out", str(out), "--no-reference", "--confirm-best", "--steps", "3"]
    assert sweep.main(args) == 0
    assert calls[-1] == ("--exp b", ["--steps", "3"]) and len(calls) == 4
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| `--exp b`")]
    assert len(table) == 2 and "1.000" in table[-1]
    # Run again: the confirmation is recorded too, so nothing runs.
    assert sweep.main(args) == 0 and len(calls) == 4
