"""Lines fitted to a terminal: wrapped between words, commands continued with a backslash."""

from __future__ import annotations

import io
import shlex
import subprocess

import pytest

from pax_eqx.programs.train import screen_lines
from pax_eqx.programs.train.screen_lines import ShellCommand, fit


def test_a_line_that_fits_is_left_alone():
    assert fit("  params   820.86K: stack 787.46K", 80) == ["  params   820.86K: stack 787.46K"]


def test_prose_wraps_between_words_under_its_label_or_field():
    line = "eval: loss 1.6936, accuracy 0.4977, bits_per_byte 2.4435, exact_match 0.0000, batches 151-200"
    assert fit(line, 80) == [
        "eval: loss 1.6936, accuracy 0.4977, bits_per_byte 2.4435, exact_match 0.0000,",
        "      batches 151-200",
    ]
    labelled = "  throughput   4,896 tokens/s over the run, evals included; last window 6,752 tokens/s"
    assert fit(labelled, 60) == [
        "  throughput   4,896 tokens/s over the run, evals included;",
        "               last window 6,752 tokens/s",
    ]
    sentence = "Finished at step 2000: train loss 1.6316, eval loss 1.6936, bits_per_byte 2.4435"
    assert fit(sentence, 40) == [
        "Finished at step 2000: train loss",
        "  1.6316, eval loss 1.6936,",
        "  bits_per_byte 2.4435",
    ]


def test_no_word_is_broken():
    words = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor".split()
    for width in range(16, 90):  # the longest word, indented two, fits in 13
        lines = fit(" ".join(words * 3), width)
        assert all(len(line) <= width for line in lines)
        assert " ".join(lines).split() == words * 3


def test_a_word_wider_than_the_terminal_stays_whole():
    path = "/a/very/long/job/dir/" + "x" * 50
    assert fit(f"Starting from scratch in {path}.", 40) == ["Starting from scratch in", f"  {path}."]


def test_a_command_continues_with_a_backslash_and_pastes_as_one(tmp_path):
    job = "/home/someone/runs/shakespeare"
    line = ShellCommand(f'  decode       python -m pax_eqx.decode --job-log-dir {job} --prompt "ROMEO: how now"')
    lines = fit(line, 60)
    assert lines == [
        "  decode       python -m pax_eqx.decode --job-log-dir \\",
        f"                 {job} --prompt \\",
        '                 "ROMEO: how now"',  # the quoted word kept whole
    ]
    assert all(len(x) <= 60 for x in lines)
    pasted = "\n".join(x[15:] if i == 0 else x for i, x in enumerate(lines))  # the command, as copied
    echoed = subprocess.run(["bash", "-c", f"printf '%s\\n' {pasted.removeprefix('python ')}"], capture_output=True,
                            text=True, check=True).stdout.splitlines()  # fmt: skip
    assert echoed == shlex.split(line[15:])[1:]


@pytest.mark.parametrize(("tty", "expected"), [(True, 2), (False, 1)])
def test_print_fitted_wraps_only_on_a_terminal(monkeypatch, tty, expected):
    class Stdout(io.StringIO):
        def isatty(self) -> bool:
            return tty

    out = Stdout()
    monkeypatch.setattr(screen_lines.sys, "stdout", out)
    monkeypatch.setenv("COLUMNS", "40")
    screen_lines.print_fitted("Finished at step 2000: train loss 1.6316, eval loss 1.6936")
    assert len(out.getvalue().splitlines()) == expected
