"""Writes expected.npz here: Praxis' own logits of the Paxml fixtures' TransformerLm
(tests/fixtures/paxml/<form>/) for inputs with padding, unpacked and packed.

Runs only in the Python 3.10 environment with Praxis/Paxml 1.4 that tests/fixtures/paxml/
generate_fixtures.py describes (CI uses the committed file):

    cd /tmp && JAX_PLATFORMS=cpu /tmp/paxenv/bin/python /path/to/tests/layers/praxis_padding/generate.py

For each form, `lm(ids, paddings)` (TransformerLm folds the paddings into its segment mask, and
every TransformerFeedForward zeroes the padded positions) and the same with packed `segment_ids`
/ `segment_pos`, whose segment 0 is the padding.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.normpath(os.path.join(HERE, "..", "..", "fixtures", "paxml"))
sys.path.insert(0, FIXTURES)

import generate_fixtures as fixtures  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import flags  # noqa: E402
from praxis import base_layer  # noqa: E402

IDS = np.random.default_rng(3).integers(0, fixtures.VOCAB, (2, fixtures.SEQ), dtype=np.int32)
PADDINGS = np.asarray([[0, 0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 1, 1, 1]], np.float32)
SEGMENT_IDS = np.asarray([[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 2, 2, 2, 0, 0, 0]], np.int32)
SEGMENT_POS = np.asarray([[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 0, 1, 2, 0, 0, 0]], np.int32)


def main() -> None:
    flags.FLAGS([sys.argv[0]])
    out = dict(ids=IDS, paddings=PADDINGS, segment_ids=SEGMENT_IDS, segment_pos=SEGMENT_POS)
    for form, settings in fixtures.FORMS.items():
        model = base_layer.instantiate(fixtures.make_experiment(settings)().task().model)
        step_dir = os.path.join(FIXTURES, form, "checkpoints", f"checkpoint_{fixtures.STEPS:08d}")
        variables = {"params": fixtures.read_params(step_dir)}
        ids, paddings = jnp.asarray(IDS), jnp.asarray(PADDINGS)
        packed = dict(segment_ids=jnp.asarray(SEGMENT_IDS), segment_pos=jnp.asarray(SEGMENT_POS))
        with base_layer.JaxContext.new_context(hparams=base_layer.JaxContext.HParams(do_eval=True)):
            unpacked_out = model.apply(variables, ids, paddings, method=lambda m, i, p: m.lm(i, p))
            packed_out = model.apply(variables, ids, paddings, method=lambda m, i, p, kw=packed: m.lm(i, p, **kw))
        out[f"{form}/unpacked"] = np.asarray(unpacked_out.logits, np.float32)
        out[f"{form}/packed"] = np.asarray(packed_out.logits, np.float32)
        print(form, "done")
    np.savez(os.path.join(HERE, "expected.npz"), **out)


if __name__ == "__main__":
    main()
