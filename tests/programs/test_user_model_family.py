"""A user's model family in one file gets every program through the model contract's hooks.

`Bigram` subclasses only `Model` / `ModelConfig` (none of pax_eqx's families): next-token logits
from the current token alone, a decoder of a few lines. It trains (throughput in tokens, a sample
at the end), evaluates and decodes from the job dir alone (samples and a beam), and plans a dry
run, without any program knowing its class. And no program tests a model family's class: the
source of pax_eqx outside models/ has no such isinstance.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import pytest
from jaxtyping import Array, Float, Int

from pax_eqx import decode, train
from pax_eqx import eval as eval_main
from pax_eqx.command_line import registry
from pax_eqx.config import config
from pax_eqx.metrics import weighted_mean
from pax_eqx.models.incremental import IncrementalDecoder
from pax_eqx.models.model import Model, ModelConfig

PACKAGE = Path(__file__).resolve().parents[2] / "pax_eqx"
FAMILIES = {
    "LanguageModel", "LanguageModelConfig", "SequenceModel", "SequenceModelConfig", "ClassificationModel",
    "ClassificationModelConfig",
}  # fmt: skip


class BigramDecoder(IncrementalDecoder):
    table: Float[Array, "vocab vocab"]
    last: Int[Array, " rows"]

    def start(self):
        return self.table[self.last], ()

    def extend(self, tokens, carry, t):
        return self.table[tokens], carry

    def select(self, carry, rows):
        return carry


class Bigram(Model):
    table: Float[Array, "vocab vocab"]
    input_keys: ClassVar[tuple[str, ...]] = ("ids", "labels", "weights")

    def param_axes(self) -> dict[str, tuple]:
        return {"table": ("vocab", None)}

    def compute_predictions(self, batch, ctx):
        return self.table[batch["ids"]], ctx

    def compute_loss(self, logits, batch):
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        nll = -jnp.take_along_axis(logp, batch["labels"][..., None], axis=-1)[..., 0]
        w = batch["weights"].astype(jnp.float32)
        return {"loss": weighted_mean(jnp.sum(nll * w), jnp.sum(w))}

    def incremental_decoder(self, prompts, max_new_tokens, pad_id, bos_id=0) -> Any:
        return BigramDecoder(self.table, jnp.asarray([p[-1] for p in prompts], jnp.int32))


@config
class BigramConfig(ModelConfig):
    """A user's bigram model. bigram_vocab: tokens it predicts over."""

    bigram_vocab: int = 256
    decodes: ClassVar[bool] = True

    def tokens_per_example(self, data: Any) -> int:
        return data.seq_len

    def token_vocab_size(self) -> int | None:
        return self.bigram_vocab

    def build(self, key) -> Bigram:
        return Bigram(0.01 * jax.random.normal(key, (self.bigram_vocab, self.bigram_vocab)))


def _experiment():
    from experiments.shakespeare import shakespeare_char

    exp = shakespeare_char()
    return exp.replace(name="user_bigram", model=BigramConfig(bigram_vocab=exp.model.vocab_size))


@pytest.fixture
def user_bigram(monkeypatch):
    registry.load_entry_points()
    monkeypatch.setitem(registry._REGISTRY, "user_bigram", _experiment)
    return "user_bigram"


RUN = [
    "--data.seq-len", "16", "--data.train.batch-size", "8", "--data.eval.batch-size", "8",
    "--data.eval.eval-loop-num-batches", "1", "--train.num-steps", "4", "--train.eval-interval-steps", "2",
    "--train.summary-interval-steps", "2", "--checkpoint.every-n-steps", "2", "--decode.max-new-tokens", "6",
    "--mesh.ici-mesh-shape", "8", "1", "1",
]  # fmt: skip


def test_a_user_model_trains_evaluates_decodes_and_plans_through_the_hooks(user_bigram, tmp_path, capsys):
    job = tmp_path / "bigram"
    assert train.main(["--exp", user_bigram, "--job-log-dir", str(job), *RUN]) == 0
    out = capsys.readouterr().out
    assert "--- sample 0" in out  # the end-of-run sample went through Model.continue_prompts
    rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 4 and any("tokens_per_s" in r for r in rows)  # counted in tokens

    assert eval_main.main(["--job-log-dir", str(job)]) == 0  # BigramConfig read back from config.json
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["step"] == 4 and result["loss"] > 0
    assert decode.main(["--job-log-dir", str(job), "--prompt", "ROMEO:", "--temperature", "0"]) == 0
    assert "ROMEO:" in capsys.readouterr().out
    assert decode.main(["--job-log-dir", str(job), "--prompt", "ROMEO:", "--beam-size", "2"]) == 0
    assert "--- 2 (score" in capsys.readouterr().out

    assert train.main(["--exp", user_bigram, *RUN, "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "activations               not estimated for a BigramConfig" in plan


def test_no_program_tests_a_model_familys_class():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "models":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                names |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
                if names & FAMILIES:
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not found, f"programs must ask the model (ModelConfig hooks), not test its class: {found}"
