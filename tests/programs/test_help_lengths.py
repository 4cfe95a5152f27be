"""`--help` is an overview a person reads in a terminal of 80 columns: `train --help` in at most
150 lines (each section's fields one line each; --help-all has the rest), every other entry
point's in at most 80 (the sections it reads, a line naming the others). Counted as the
terminal shows them: a line longer than 80 characters takes several."""

from __future__ import annotations

import importlib
import math

import pytest

LIMITS = {"train": 150} | {
    name: 80
    for name in (
        "eval",
        "decode",
        "inspect_data",
        "import_pax",
        "plots",
        "import_hf",
        "export_hf",
        "prepare_data",
        "prepare_images",
        "tune",
        "serve",
        "export",
    )  # fmt: skip
}


def _terminal_lines(text: str, columns: int = 80) -> int:
    return sum(max(1, math.ceil(len(line) / columns)) for line in text.rstrip("\n").split("\n"))


@pytest.mark.parametrize("program", sorted(LIMITS))
def test_help_fits(program, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    main = importlib.import_module(f"pax_eqx.{program}").main
    try:
        code = main(["--help"])
    except SystemExit as e:  # argparse and tyro exit after printing help
        code = e.code
    assert code in (0, None)
    out = capsys.readouterr().out
    assert "usage" in out.lower()
    assert _terminal_lines(out) <= LIMITS[program], out
