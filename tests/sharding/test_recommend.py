"""`--dry-run --recommend`: the search, its time model's arithmetic, and its refusals.

The memory of each recommended layout is the dry run's own (`dry_run.MemoryModel`), so the winner
is checked the way a user checks it: its printed dry-run command is run and must say it fits, with
the same bytes. The time model is checked against its documented formulas on hand-computed cases,
and against the one H100 measurement its matmul efficiency is fitted to (a calibration, not a
validation: docs/performance.md says what a GPU would have to check).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from experiments import registry
from pax_eqx import train
from pax_eqx.config import ConfigError
from pax_eqx.programs.plan.dry_run import MemoryModel
from pax_eqx.programs.plan.recommend import Layout, model_sizes, recommend, step_time
from pax_eqx.sharding.device_kinds import DEVICE_KINDS

RECOMMEND = ("--dry-run", "--recommend", "--dry-run-devices")
ROWS = re.compile(r"^\s+(\d) (.+?)\s+(\S+)\s+(\d+)\s+(\d+)\s+([\d.]+) GiB\s+([\d.]+) (ms|s)\s+([\d.]+)%", re.M)


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = train.main(list(argv))
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def command_after(label: str, out: str) -> list[str]:
    """The command printed after `label`, its lines (continued with ` \\` to fit the terminal) joined."""
    line = next(row for row in out.replace(" \\\n", " ").splitlines() if row.startswith(label))
    return shlex.split(line[len(label) :])[3:]  # drop `python -m pax_eqx.train`


def flat(out: str) -> str:
    """`out` with its lines (broken at spaces to fit the terminal) joined: one space between words."""
    return " ".join(out.replace(" \\\n", " ").split())


def test_gpt3_xl_on_8_h100s_ranks_five_and_its_winner_fits_by_its_own_dry_run(capsys):
    code, out, err = run_main(capsys, "--exp", "gpt3_xl", *RECOMMEND, "8", "--dry-run-device-memory-gb", "80")
    assert code == 0, err
    rows = ROWS.findall(out)
    assert [r[0] for r in rows] == ["1", "2", "3", "4", "5"], out
    seconds = [float(r[6]) * (1e-3 if r[7] == "ms" else 1) for r in rows]
    assert seconds == sorted(seconds)
    assert all(float(r[5]) <= 80 for r in rows)
    assert "Rejected:" in out
    assert ("remat none: its activations are under-counted" in flat(out)) == any(r[2] == "none" for r in rows)
    # The printed dry run of the winner: the same memory, and it fits.
    code, plan_out, _ = run_main(capsys, *command_after("Its dry run:", out))
    assert code == 0 and "Verdict: fits in 80 GiB per device." in plan_out
    total = float(re.search(r"total\s+([\d.]+) GiB", plan_out).group(1))
    assert total == pytest.approx(float(rows[0][5]), abs=0.06)
    assert "--job-log-dir runs/gpt3_xl --mesh.ici-mesh-shape" in flat(out)


ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[list[str]]:
    text = (ROOT / "README.md").read_text().replace("\\\n", " ")
    lines = [line for line in text.splitlines() if line.startswith("python -m pax_eqx.train")]
    return [shlex.split(line.split("  #")[0])[3:] for line in lines]


def test_175b_on_1024_chips_of_80_gib(capsys):
    """The README's example: the default 8-device layout needs 349 GiB a device; the search finds
    1024-chip layouts that fit 80 GiB, its winner's dry run agrees, and the README's next command is
    that dry run."""
    argv = ["--exp", "c4_gpt3_175b", "--data.train.batch-size", "1536", "--dry-run", "--recommend",
            "--dry-run-devices", "1024", "--dry-run-device-memory-gb", "80"]  # fmt: skip
    readme = readme_commands()
    assert argv in readme
    code, out, err = run_main(capsys, *argv)
    assert code == 0, err
    assert "128 hosts of 8" in flat(out) and len(ROWS.findall(out)) == 5
    dry = command_after("Its dry run:", out)
    assert dry[:4] == ["--exp", "c4_gpt3_175b", "--data.train.batch-size", "1536"]
    assert readme[readme.index(argv) + 1] == dry, "README.md: the command after the --recommend is its winner's dry run"
    code, plan_out, _ = run_main(capsys, *dry)
    assert code == 0 and "Verdict: fits in 80 GiB per device." in plan_out
    assert "1024 devices" in plan_out


def test_a_pipelined_model_keeps_its_stages_and_searches_its_microbatches(capsys):
    exp = registry.load_experiment("shakespeare_pipelined")
    found = recommend(exp, 8, 80.0, "h100")
    assert found.best is not None and "pipe-mb" in found.text
    assert found.best.layout.shape["stage"] == exp.model.pipeline.num_stages
    code, plan_out, err = run_main(capsys, *command_after("Its dry run:", found.text))
    assert code == 0 and "Verdict: fits" in plan_out, err
    assert f"{found.best.pipeline_microbatches} microbatches of" in flat(plan_out)


def test_a_collective_costs_what_the_docstring_says():
    """16 H100s on 2 hosts, pure data parallelism (8 over NVLink x 2 over InfiniBand): the gradient
    all-reduce moves 2 x (7/8 x G over NVLink + 1/2 x G/8 over InfiniBand), G the float32 gradients."""
    exp = registry.load_experiment("gpt3_xl")
    exp = exp.replace(data=exp.data.replace(train=exp.data.train.replace(batch_size=32)))
    h100 = DEVICE_KINDS["h100"]
    sizes = model_sizes(MemoryModel(exp))
    layout = Layout((1, 8, 1, 1), (1, 2, 1, 1))
    time = step_time(exp, layout, h100, sizes)
    g = sizes.params * 4
    assert time.data == pytest.approx(2 * (7 / 8 * g / 450e9 + 1 / 2 * g / 8 / 50e9))
    assert time.fsdp == 0 and time.tensor == 0 and time.stage == 0
    # tensor 8 inside a host: 4 all-reduces a layer (the policy recomputes no layer) of [tokens, d] bf16
    tensor = step_time(exp, Layout((1, 1, 1, 8), (1, 2, 1, 1)), h100, sizes)
    rows_tokens = 32 * 2048 / 2
    assert tensor.tensor == pytest.approx(4 * 24 * 2 * 7 / 8 * rows_tokens * 2048 * 2 / 450e9)


def test_the_matmul_efficiency_reproduces_the_h100_step_it_was_fitted_to():
    """gpt3_xl on one H100: 625.7 ms measured (docs/performance.md); the model, with the efficiency
    fitted to it, must land within 5% (this guards the constants, it does not validate the model)."""
    exp = registry.load_experiment("gpt3_xl")
    time = step_time(exp, Layout((1, 1, 1, 1), (1, 1, 1, 1)), DEVICE_KINDS["h100"], model_sizes(MemoryModel(exp)))
    assert time.total == pytest.approx(0.6257, rel=0.05)


def test_predicted_steps_against_the_recorded_h100_sweep():
    """The seven gpt3_xl variants measured on one H100 (benchmarks/sweeps/recommend_time_model_h100.jsonl,
    2026-11-26, jax 0.11.2): every prediction within 20% of its measured step, and the order of the
    batch-16 policies kept (remat full slower than the dot-saving policies)."""
    from benchmarks.time_model_check import table

    rows = [row.split(" | ") for row in table(str(ROOT / "benchmarks/sweeps/recommend_time_model_h100.jsonl"))[2:]]
    assert len(rows) == 7
    ratios = {row[0].strip("| `"): float(row[3]) for row in rows}
    assert all(0.8 <= r <= 1.2 for r in ratios.values()), ratios
    measured = {row[0].strip("| `"): float(row[1].split()[0]) for row in rows}
    full, dots = "--exp gpt3_xl --model.remat-policy full", "--exp gpt3_xl"
    assert measured[full] > measured[dots] and ratios[full] * measured[full] > ratios[dots] * measured[dots]


def test_nothing_fits_exits_1_and_says_the_least_memory(capsys):
    code, out, _ = run_main(capsys, "--exp", "gpt3_xl", *RECOMMEND, "8", "--dry-run-device-memory-gb", "1")
    assert code == 1 and "Nothing fits 1 GiB: the least memory is" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--recommend", "--dry-run-devices", "8"], "--recommend searches layouts in a dry run: add --dry-run"),
        (["--dry-run", "--recommend"], "--recommend needs --dry-run-devices N"),
        (["--dry-run", "--dry-run-devices", "8"], "--dry-run-devices is read only by --recommend"),
    ],
)
def test_flags_that_need_each_other(capsys, argv, message):
    code, _, err = run_main(capsys, "--exp", "gpt3_xl", *argv)
    assert code == 2 and message in err


@pytest.mark.parametrize(
    "devices, extra, message",
    [
        (24, {}, "no layout of 24 devices (8 per ICI domain) splits data.train.batch_size=16 over its batch axes "
                 "(data x fsdp x stage: at least 3 ways); use a multiple of 3"),
        (12, {}, "--dry-run-devices 12 is not a whole number of hosts of 8 devices"),
        (16, {"ici_size": 3}, "--dry-run-ici-size 3 does not divide --dry-run-devices 16"),
        # a billion devices: refused from their divisors (found up to sqrt(n)), not from a scan of 1..n (minutes)
        (10**9, {}, "no layout of 1000000000 devices (8 per ICI domain) splits data.train.batch_size=16"),
    ],
)  # fmt: skip
def test_devices_that_nothing_divides_are_refused_with_the_fix(devices, extra, message):
    exp = registry.load_experiment("gpt3_xl")
    with pytest.raises(ConfigError) as e:
        recommend(exp, devices, 80.0, "h100", **extra)
    assert message in str(e.value)


def test_a_tpu_is_planned_with_xla_attention(capsys):
    """On a TPU "auto" attention is XLA's: the [heads, S, S] scores are priced, and the printed dry
    run says so (its flag), so it plans the same bytes as the table."""
    argv = ["--exp", "gpt3_xl", *RECOMMEND, "8", "--dry-run-device-kind", "tpu_v5p"]
    code, out, err = run_main(capsys, *argv)
    assert code == 0, err
    dry = command_after("Its dry run:", out)
    assert "--model.block.attention.implementation" in dry
    code, plan_out, _ = run_main(capsys, *dry)
    assert code == 0 and "attention XLA, with S x S scores" in plan_out
    total = float(re.search(r"total\s+([\d.]+) GiB", plan_out).group(1))
    assert total == pytest.approx(float(ROWS.findall(out)[0][5]), abs=0.06)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dry-run-devices", "0"], "error: --dry-run-devices 0 is out of range: it must be a finite number > 0."),
        (["--dry-run-devices", "8", "--dry-run-device-memory-gb", "0"],
         "error: --dry-run-device-memory-gb 0 is out of range: it must be a finite number > 0."),
        (["--dry-run-devices", "8", "--dry-run-device-memory-gb", "nan"],
         "error: --dry-run-device-memory-gb nan is out of range: it must be a finite number > 0."),
        (["--dry-run-devices", "8", "--dry-run-device-memory-gb", "inf"],
         "error: --dry-run-device-memory-gb inf is out of range: it must be a finite number > 0."),
        (["--dry-run-devices", "8", "--dry-run-devices-per-host", "0"],
         "error: --dry-run-devices-per-host 0 is out of range: it must be a finite number > 0."),
        (["--dry-run-devices", "8", "--dry-run-ici-size", "-1"],
         "error: --dry-run-ici-size -1 is out of range: it must be a finite number > 0."),
        (["--dry-run-devices", "8", "--dry-run-device-kind", "v100"],
         "error: argument --dry-run-device-kind: invalid choice: 'v100' (choose from 'a100', 'h100', 'tpu_v4', "
         "'tpu_v5e', 'tpu_v5p'); see python -m pax_eqx.train --help."),
    ],
)  # fmt: skip
def test_recommend_flags_out_of_range_are_one_line(args, message, capsys):
    """`--dry-run-device-kind a100` printed argparse's usage block and a second line; a memory of
    0 GiB was searched and nothing fit."""
    from pax_eqx import train

    with pytest.raises(SystemExit) as info:
        train.main(["--exp", "gpt3_xl", "--dry-run", "--recommend", *args])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [message]
