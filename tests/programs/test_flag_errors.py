"""A misspelt flag is one plain `error:` message on every terminal, with the nearest flags.

tyro reports it in a rich box; on a colour terminal rich puts escape codes between the box's
characters, which the plain-text cleanup missed (`error: │ Unrecognized options ...` with the
box drawn through it). Run in a pseudo-terminal with colour on, as a person sees it: the message
is broken at spaces to the terminal's 80 columns, its lines after the first indented under it.
"""

from __future__ import annotations

from terminal import run_in_a_terminal

from pax_eqx.command_line import flag_hints, registry


def test_a_wrong_flag_on_a_colour_terminal_is_one_plain_message(tmp_path):
    args = ["-m", "pax_eqx.train", "--exp", "shakespeare_char", "--job-log-dir", "run", "--num-steps", "100"]
    code, _, out = run_in_a_terminal(args, tmp_path, columns=80, env={"FORCE_COLOR": "1"}, timeout=120)
    assert code == 2
    lines = out.replace("\r", "").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("error: "))
    message = lines[start:]
    assert len(message) > 1 and all(line.startswith(" " * 7) for line in message[1:]), out
    assert all(len(line) <= 80 for line in message), out
    assert not [line for line in lines[:start] if "error" in line], out
    text = " ".join(line.strip() for line in message)
    assert text.startswith("error: Unrecognized options: --num-steps, 100 -- Perhaps you meant: --train.num-steps")
    assert text.endswith("every train flag: python -m pax_eqx.train --help train")
    assert "\x1b" not in text and "│" not in text and "─" not in text
    assert not (tmp_path / "run").exists()  # nothing written


def test_every_misspelt_flag_gets_its_nearest_flags():
    exp = registry.load_experiment("shakespeare_char")
    flags = ["--" + p.replace("_", "-") for p in flag_hints.field_paths(exp)]
    assert flag_hints.nearest_flags("--lr", flags)[0] == "--learner.learning-rate"  # the initials of the last part
    assert flag_hints.nearest_flags("--max-tokens", flags)[0] == "--decode.max-new-tokens"  # the last part, close
    assert flag_hints.nearest_flags("--data.train.bach-size", flags)[0] == "--data.train.batch-size"  # the whole path
    assert flag_hints.nearest_flags("--zzzz", flags) == []
    message = flag_hints.with_nearest_flags("Unrecognized options: --lr, 0.1 -- For full helptext, run x --help", exp)
    assert message == (
        "Unrecognized options: --lr, 0.1 -- --lr: did you mean --learner.learning-rate, --learner.l2-regularization? "
        "-- For full helptext, run x --help"
    )
    # tyro's pointer at its 900-line help becomes the section of the first flag the line names
    assert flag_hints.with_section_help(message, exp).endswith("-- every learner flag: x --help learner")
    unknown = "Unrecognized options: --zzzz -- For full helptext, run x --help"
    assert flag_hints.with_section_help(unknown, exp) == unknown  # no section named: as tyro said it
