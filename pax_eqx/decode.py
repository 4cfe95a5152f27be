"""`python -m pax_eqx.decode --job-log-dir DIR --prompt "ROMEO:" --max-new-tokens 200
[--temperature 0.8 --top-k 40 --top-p 0.95 --seed 0 --num-samples 1]`: print samples;
`[--strategy greedy]`: the argmax; `[--strategy beam --beam-size 4 --length-norm-alpha 0.8]` (or
`--beam-size 4` alone): print beam search's n-best list instead.

A model that decodes examples (a classifier) prints each of the first `--num-samples` eval
examples' prediction, or those of the files `--inputs a.png b.png` names, and writes them to
DIR/decode/step_<step>.jsonl (programs.decode.example_decoding).

The experiment is the one DIR/config.json saved (every flag the run was trained with); `--exp`
is needed only for a job dir without one.

The short flags are the `decode.*` fields of the experiment (`--decode.prompt` works too).
"""

from __future__ import annotations

from collections.abc import Sequence

from pax_eqx import programs
from pax_eqx.command_line import cli, entry

DESCRIPTION = (
    "Sample text (or beam-search an n-best list) from the newest checkpoint of a job dir, with the experiment "
    "and flags its config.json saved. --prompt, --max-new-tokens, --strategy (sample, greedy, beam), "
    "--temperature, --top-k, --top-p, --seed, --num-samples, --eos-id, --beam-size (also choosing the beam), "
    "--length-norm-alpha, --beam-style and --inputs are short for the "
    "--decode.* fields below. A classifier prints (and writes to DIR/decode/) each eval example's or input "
    "file's predicted class."
)
_SHORT = (
    "prompt", "max-new-tokens", "strategy", "temperature", "top-k", "top-p", "seed", "num-samples", "eos-id",
    "beam-size", "length-norm-alpha", "inputs", "beam-style",
)  # fmt: skip


def expand_short_flags(argv: list[str]) -> list[str]:
    """--top-k 40 -> --decode.top-k 40 (also --top_k and --top-k=40). `--beam-size N`, as before
    strategies were choices, also chooses the beam (`--decode.strategy beam --decode.beam-size N`);
    `--beam-size 1` chooses sampling."""
    out, i = [], 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        bare = name[2:].replace("_", "-") if name.startswith("--") else None
        if bare == "beam-size":
            size, span = (value, 1) if eq else ((argv[i + 1], 2) if i + 1 < len(argv) else ("", 1))
            if size.strip() == "1":
                out += ["--decode.strategy", "sample"]
                i += span
                continue
            out += ["--decode.strategy", "beam"]
        out.append(f"--decode.{bare}{eq}{value}" if bare in _SHORT else argv[i])
        i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    import sys

    argv = expand_short_flags(list(sys.argv[1:] if argv is None else argv))
    exp, job_dir, _ = cli.parse(
        argv, "python -m pax_eqx.decode", DESCRIPTION, saved_experiment=True, sections=("decode", "checkpoint", "mesh")
    )
    from pax_eqx.programs.decode.sampling import print_samples
    from pax_eqx.programs.restore import restore_for_inference

    if exp.model.decodes_examples:
        from pax_eqx.programs.decode.example_decoding import print_decoded

        rt, state, step = restore_for_inference(exp, job_dir, "decode from")
        source = f"{len(exp.decode.inputs)} files" if exp.decode.inputs else "the eval split"
        print(f"Decoding {source} with the checkpoint at step {step}:")
        print_decoded(rt, state, exp.decode, step)
        return 0
    rt, state, step = restore_for_inference(exp, job_dir, "decode from", prompt=exp.decode.prompt)
    title = "Filling the prompt's masks" if exp.model.fills_prompts else exp.decode.strategy.title
    print(f"{title} from the checkpoint at step {step}:")
    print_samples(rt, state, exp.decode)
    return 0


if __name__ == "__main__":
    entry.run(main, memory_planner=programs.planned_bytes)  # an out-of-memory line quotes the plan
