"""Does the tiny BERT learn? Masked-byte accuracy after a short CPU run, beside a constant guess.

    python -m benchmarks.bert_learning [--steps 400] [--eval-batches 50]

Trains `bert_shakespeare_char` (experiments/bert.py: 4 layers, d 128, bytes of Shakespeare's
plays, 15% of them chosen and mostly masked) for `--steps` steps with its own recipe, the cosine
schedule ending at the last step (or just after its warmup), through the Task's jitted train step (what `python -m
pax_eqx.train` runs, without the job dir). Then it reads `--eval-batches` eval batches (the held-out
plays), masks them as eval does (fixed per-row keys) and prints

- the model's accuracy at the chosen bytes (the eval `accuracy` metric, merged over the batches),
- the accuracy of always guessing the byte most frequent among those same chosen bytes (the best
  constant guess, chosen knowing the answers, so it flatters the baseline),

and exits 1 unless the model's is at least twice the baseline's.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import numpy as np

from pax_eqx.command_line import registry
from pax_eqx.data import build_input, build_tokenizer
from pax_eqx.programs.runtime import build_task


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--eval-batches", type=int, default=50)
    args = parser.parse_args(argv)

    exp = registry.load_experiment("bert_shakespeare_char")
    schedule = exp.learner.schedule
    learner = exp.learner.replace(schedule=schedule.replace(decay_end=max(args.steps, schedule.warmup_steps + 1)))
    exp = exp.replace(learner=learner, train=exp.train.replace(num_steps=args.steps))
    exp.validate(data_files=True)
    task = build_task(exp)
    tokenizer = build_tokenizer(exp.data)
    train_input = build_input(exp.data, "train", tokenizer, num_infeed_hosts=1, infeed_host_index=0)
    eval_input = build_input(exp.data, "eval", tokenizer, num_infeed_hosts=1, infeed_host_index=0)

    start = time.perf_counter()
    state = jax.jit(task.init_state)(jax.random.PRNGKey(exp.train.seed))
    train_step = jax.jit(task.train_step, donate_argnums=0)
    for step in range(args.steps):
        state, out = train_step(state, train_input.get_next())
        if (step + 1) % 100 == 0 or step + 1 == args.steps:
            loss = float(out.metrics["avg_xent"].value)
            print(f"step {step + 1}: masked-LM loss {loss:.3f} ({time.perf_counter() - start:.0f} s)", flush=True)
    train_seconds = time.perf_counter() - start

    eval_step = jax.jit(task.eval_step)
    model = task.model(task.inference_params(state))
    correct = total = 0.0
    counts = np.zeros(model.masked_lm.vocab_size, np.int64)
    for _ in range(args.eval_batches):
        batch = eval_input.get_next()
        accuracy = eval_step(state, batch).metrics["accuracy"]
        correct += float(accuracy.value) * float(accuracy.weight)
        total += float(accuracy.weight)
        # The bytes eval chose: the same fixed per-row draws the model's eval forward makes.
        ids = jax.numpy.asarray(batch["ids"])
        paddings = 1.0 - (jax.numpy.asarray(batch["segment_ids"]) > 0)
        chosen = np.asarray(model.masked_lm.decide(model.masked_lm.eval_draws(ids), paddings).chosen)
        counts += np.bincount(np.asarray(batch["ids"])[chosen], minlength=counts.size)
    model_accuracy = correct / total
    commonest = int(np.argmax(counts))
    baseline = counts[commonest] / counts.sum()
    assert counts.sum() == total, (counts.sum(), total)
    print(
        f"bert_shakespeare_char, {args.steps} steps on {jax.devices()[0].platform} ({train_seconds:.0f} s), "
        f"{int(total)} chosen bytes in {args.eval_batches} eval batches:"
    )
    print(f"  model accuracy                     {model_accuracy:.4f}")
    print(f"  always {tokenizer.decode([commonest])!r} (the commonest chosen byte) {baseline:.4f}")
    print(f"  ratio                              {model_accuracy / baseline:.2f}x")
    return 0 if model_accuracy >= 2 * baseline else 1


if __name__ == "__main__":
    sys.exit(main())
