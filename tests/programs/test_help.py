"""`--help-all` is readable: the program's flags, each experiment with its description, and every
nested field with its whole help. (`--help`, the overview, and `--help SECTION`:
test_choices_and_inert_flags.py and test_terminal_width.py.)

The field help is cut out of each config class's docstring (`cli.help_spec`): one field's
sentence under its flag, the rest of the docstring as the group's description, each paragraph
rewrapped as a whole (no line of a docstring's indented continuation left standing alone).
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from pax_eqx import decode, inspect_data, train
from pax_eqx import eval as eval_program
from pax_eqx.command_line import cli, registry


def help_text(main, capsys, *argv: str, flag: str = "--help-all") -> str:
    with pytest.raises(SystemExit) as info:
        main([*argv, flag])
    assert info.value.code in (0, None)
    return capsys.readouterr().out


@pytest.mark.parametrize(
    "main", [train.main, eval_program.main, decode.main, inspect_data.main], ids=lambda m: m.__module__
)
def test_help_lists_the_flags_the_experiments_and_the_fields(main, capsys):
    out = help_text(main, capsys)
    assert out.startswith("usage: python -m pax_eqx.")
    for flag in ("--exp NAME", "--job-log-dir DIR", "--verbose"):
        assert flag in out
    listed = re.findall(r"^  (\w+)(?: \(.*\))?$", out, re.M)
    assert listed == registry.names()  # every experiment, in order, each with its sentence below
    assert "--model.num-layers INT" in out and "--decode.strategy.temperature FLOAT" in out


def test_each_field_has_its_own_sentence(capsys):
    out = help_text(train.main, capsys, "--exp", "shakespeare_char")
    lines = out.splitlines()

    def help_of(flag: str) -> str:
        i = next(i for i, line in enumerate(lines) if line.strip("│ ").startswith(flag))
        return lines[i + 1].strip("│ ")

    assert help_of("--model.num-layers INT").startswith("transformer layers (Pax's NUM_LAYERS).")
    assert help_of("--model.model-dims INT").startswith("the width of the residual stream (Pax's MODEL_DIMS).")
    assert help_of("--model.dim-per-head INT").startswith("each head's width; 0 = model_dims // num_heads.")
    assert help_of("--learner.learning-rate FLOAT").startswith("the base rate; the schedule multiplies it")
    assert help_of("--learner.optimizer.b2 FLOAT").startswith("the decays of the first and second moments.")
    assert help_of("--task.losses [STR [STR ...]]").startswith("the names of the model's loss metrics")
    assert help_of("--data.train.batch-size INT").startswith("examples per host per batch")


def test_no_docstring_debris(capsys):
    """No dataclass signature for a description, and no docstring line that kept its indent
    ("│   NUM_HEADS." under a reflowed paragraph)."""
    for name in ("shakespeare_char", "digits_resnet", "shakespeare_span_corruption"):
        out = help_text(train.main, capsys, "--exp", name)
        assert "ExperimentConfig(*" not in out and "Config(*," not in out
        stray = [line for line in out.splitlines() if re.match(r"^│ {2,5}\S", line)]
        assert not stray, (name, stray)


def test_field_helps_are_cut_from_the_docstring():
    @cli_config
    class Example:
        """An example. It has prose.

        a / b: the two sizes (each > 0). c (optional): one more; note: this stays with c.
        Seq2seq things (later):

        A closing paragraph that names no field.
        """

        a: int = 1
        b: int = 2
        c: int = 3

    prose, helps = cli._field_helps(Example)
    assert prose == "An example. It has prose.\n\nA closing paragraph that names no field."
    assert helps == {
        "a": "the two sizes (each > 0).",
        "b": "the two sizes (each > 0).",
        "c": "one more; note: this stays with c.",
    }


def cli_config(cls):
    from pax_eqx.config import config

    return config(cls)


def test_help_of_the_real_command_is_quick_and_exits_0():
    result = subprocess.run(
        [sys.executable, "-m", "pax_eqx.train", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "experiments (--exp NAME" in result.stdout and "Loading experiment" not in result.stdout
