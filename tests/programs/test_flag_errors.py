"""A misspelt flag is one plain `error:` line on every terminal, with the nearest flags.

tyro reports it in a rich box; on a colour terminal rich puts escape codes between the box's
characters, which the plain-text cleanup missed (`error: │ Unrecognized options ...` with the
box drawn through it). Run in a pseudo-terminal with colour on, as a person sees it.
"""

from __future__ import annotations

from terminal import run_in_a_terminal

from pax_eqx.command_line import flag_hints, registry


def test_a_wrong_flag_on_a_colour_terminal_is_one_plain_line(tmp_path):
    args = ["-m", "pax_eqx.train", "--exp", "shakespeare_char", "--job-log-dir", "run", "--num-steps", "100"]
    code, _, out = run_in_a_terminal(args, tmp_path, columns=80, env={"FORCE_COLOR": "1"}, timeout=120)
    assert code == 2
    errors = [line for line in out.splitlines() if "error" in line]
    assert len(errors) == 1, out
    line = errors[0].strip()
    assert line.startswith("error: Unrecognized options: --num-steps, 100 -- Perhaps you meant: --train.num-steps")
    assert "\x1b" not in line and "│" not in line and "─" not in line
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
