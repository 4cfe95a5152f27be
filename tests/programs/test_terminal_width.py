"""What a person sees in a terminal of 80 columns: no line wider than the terminal, every line
broken at a space (never inside a flag such as `--train.num-steps`), no help cut short.

Each command runs in a pseudo-terminal of 80 columns (`terminal.run_in_a_terminal`), and its raw
output is read line by line. That every break falls at a space is checked against the same
command with its lines whole (piped, an error and a report stay whole; --help at COLUMNS=1000):
the words, read in order, are the same; a break inside a word would leave its two halves. The
whole lines of an error or of --help come from the same main() in this process (its output is
piped: pytest's capture), those of the recommend report from a second process (its search runs
at full speed there).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from terminal import run_in_a_terminal

from pax_eqx.programs.plan.recommend import _COST_SHORT, _REMAT_SHORT

COLUMNS = 80


def _lines(raw: str) -> list[str]:
    return [line for line in raw.replace("\r\n", "\n").replace("\r", "\n").split("\n") if line.strip()]


def _run(args: list[str], tmp_path, columns: int | None = None) -> subprocess.CompletedProcess:
    """`python ARGS` with stdout and stderr piped (no terminal): errors and reports stay whole;
    --help is laid out for `columns` (COLUMNS), or 80."""
    env = {name: value for name, value in os.environ.items() if name not in ("COLUMNS", "LINES")}
    if columns:
        env["COLUMNS"] = str(columns)
    return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def _whole(args: list[str], monkeypatch, capsys, tmp_path, columns: int | None = None) -> tuple[int, str, str]:
    """(status, stdout, stderr) of `python -m pax_eqx.train ARGS` run through entry.run in this
    process, its output piped (whole lines; --help laid out for `columns`, or 80)."""
    from pax_eqx import train
    from pax_eqx.command_line import entry

    monkeypatch.delenv("LINES", raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)
    if columns:
        monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        entry.run(lambda: train.main(args))
    out, err = capsys.readouterr()
    return done.value.code, out, err


def _fits(lines: list[str], screen: list[str]) -> None:
    """No raw line is wider than the terminal, so the terminal wrapped none (its screen shows the
    same lines)."""
    wide = [line for line in lines if len(line) > COLUMNS]
    assert not wide, wide
    shown = min(len(lines), len(screen))
    assert [line.rstrip() for line in lines[len(lines) - shown :]] == screen[len(screen) - shown :]


def _error_message(lines: list[str]) -> str:
    """The `error:` line and its continuation lines (indented under it), joined at their breaks."""
    start = next(i for i, line in enumerate(lines) if line.startswith("error: "))
    message = lines[start:]
    assert all(line.startswith(" " * len("error: ")) for line in message[1:]), message
    return " ".join(" ".join(line.split()) for line in message)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--train.num-steps", "x"], "Error parsing --train.num-steps: invalid literal for int()"),
        (["--exp", "shakespear_char"], "Did you mean 'shakespeare_char'"),
    ],
    ids=["flag-error", "unknown-exp"],
)
def test_an_error_is_broken_at_spaces_to_the_terminals_width(tmp_path, monkeypatch, capsys, args, says):
    argv = ["-m", "pax_eqx.train", *args, "--job-log-dir", "run"]
    code, screen, raw = run_in_a_terminal(argv, tmp_path, columns=COLUMNS, timeout=300)
    lines = _lines(raw)
    assert code == 2, raw
    _fits(lines, screen)
    piped_code, _, piped = _whole(argv[2:], monkeypatch, capsys, tmp_path)
    one_line = [line for line in piped.splitlines() if line.startswith("error: ")]
    assert piped_code == 2 and len(one_line) == 1 and len(one_line[0]) > COLUMNS, piped  # long enough to break
    message = _error_message(lines)
    assert message == " ".join(one_line[0].split())  # the same words: every break at a space
    assert says in message
    assert len(lines) - lines.index(next(line for line in lines if line.startswith("error: "))) > 1


def test_an_unknown_experiment_names_the_nearest_not_all(tmp_path):
    argv = ["-m", "pax_eqx.train", "--exp", "gpt3_xxl"]
    code, _, raw = run_in_a_terminal(argv, tmp_path, columns=COLUMNS, timeout=300)
    message = _error_message(_lines(raw))
    assert code == 2
    assert "Did you mean 'gpt3_xl'" in message and "--help lists the experiments" in message
    assert "shakespeare_char" not in message and "c4_gpt3_175b" not in message  # not every experiment
    assert len(message) < 400, message


def _words(text: str) -> list[str]:
    return [word for word in text.split() if word != "\\"]


def test_the_recommend_table_fits_80_columns(tmp_path):
    """README's --recommend (10 s on a CPU): the table drops to short names and one space between
    columns; its prose and commands are broken at spaces, the commands continued with ` \\`."""
    argv = ["-m", "pax_eqx.train", "--exp", "c4_gpt3_175b", "--data.train.batch-size", "1536", "--dry-run",
            "--recommend", "--dry-run-devices", "1024", "--dry-run-device-memory-gb", "80"]  # fmt: skip
    code, screen, raw = run_in_a_terminal(argv, tmp_path, columns=COLUMNS, rows=100, timeout=300)
    lines = _lines(raw)
    assert code == 0, raw
    _fits(lines, screen)
    whole = _run(argv, tmp_path, columns=1000)
    assert whole.returncode == 0 and max(map(len, whole.stdout.splitlines())) > 200  # the unshortened table
    known = set(_words(whole.stdout)) | set(_REMAT_SHORT.values()) | set(_COST_SHORT.values())
    strip = "()[]{},;:."
    split = [w for w in _words(raw) if w not in known and w.strip(strip) not in {k.strip(strip) for k in known}]
    assert not split, split  # a word broken in two would leave halves no whole output has
    for label in ("Train the best: ", "Its dry run:    "):  # the commands, their continuations joined
        narrow = next(
            line for line in raw.replace("\r", "").replace(" \\\n", " ").splitlines() if line.startswith(label)
        )
        wide = next(line for line in whole.stdout.splitlines() if line.startswith(label))
        assert narrow.split() == wide.split()
    header = next(i for i, line in enumerate(lines) if line.split()[0] == "#")
    rows = lines[header + 1 : header + 6]
    assert [row.split()[0] for row in rows] == ["1", "2", "3", "4", "5"] and all(" full " in row for row in rows), rows


@pytest.mark.parametrize("args", [["--help"], ["--help", "learner"]], ids=["help", "help-learner"])
def test_help_fits_80_columns_and_nothing_is_cut(tmp_path, monkeypatch, capsys, args):
    argv = ["-m", "pax_eqx.train", *args]
    code, screen, raw = run_in_a_terminal(argv, tmp_path, columns=COLUMNS, rows=300, timeout=300)
    lines = _lines(raw)
    assert code == 0, raw
    _fits(lines, screen)
    assert "…" not in raw and not [line for line in lines if line.endswith("...")]  # no help cut short
    if args == ["--help"]:
        assert len(raw.replace("\r", "").rstrip("\n").split("\n")) <= 150
    whole_code, whole, _ = _whole(args, monkeypatch, capsys, tmp_path, columns=1000)
    assert whole_code == 0
    assert _words(raw) == _words(whole)  # the same words in the same order: every break at a space


@pytest.mark.parametrize("name", ["shakespeare_char", "digits_vit", "t5_1_1_small", "shakespeare_pipelined"])
def test_every_flag_is_in_its_sections_help_at_80_columns(name):
    """`--help SECTION` of each section lists every flag of it (the chosen variants' too), in lines
    of at most 80 columns, and the overview stays within 150 lines with the program's own flags."""
    from pax_eqx.command_line import registry, short_help
    from pax_eqx.command_line.cli import python_only_fields
    from pax_eqx.command_line.flag_hints import field_paths

    exp = registry.load_experiment(name)
    python_only = set(python_only_fields(exp))
    for section, _ in short_help._sections(exp):
        text = short_help.section_help(exp, section, COLUMNS)
        assert all(len(line) <= COLUMNS for line in text.splitlines()), section
        flags = set(" ".join(text.split()).replace(",", " ").split())
        for path in field_paths(getattr(exp, section), section + "."):
            if path not in python_only:
                assert "--" + path.replace("_", "-") in flags, (section, path)
    overview = short_help.short_help(exp, COLUMNS).splitlines()
    assert all(len(line) <= COLUMNS for line in overview) and len(overview) <= 100
    assert short_help.section_help(exp, "no_such_section", COLUMNS) is None
