"""Each family's tokenizer, as import_hf sets it up, turns its model's greedy continuation (the
KV-cache decode, whose logits test_import_logits.py checks against transformers') into text: the
end-of-sequence token is the one the model's config.json names and a prompt round-trips."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from hf_models import FAMILIES, FIXTURES, imported_model

from pax_eqx.data.build import build_tokenizer
from pax_eqx.hf.importer import HfSource

PROMPT = "Now is the winter of"
NEW_TOKENS = 4


def _greedy_with_the_cache(model, ids: np.ndarray, new: int) -> list[int]:
    import equinox as eqx

    t = ids.shape[1] + new
    cache, valid = model.init_cache(1, t), jnp.ones((1, t), bool)
    positions = jnp.arange(t)[None]
    step = eqx.filter_jit(model.extend_step)
    logits, cache = step(jnp.asarray(ids), cache, jnp.asarray(0), positions[:, : ids.shape[1]], valid)
    out = [int(jnp.argmax(logits[0, -1]))]
    for i in range(ids.shape[1], t - 1):
        logits, cache = step(jnp.asarray([[out[-1]]]), cache, jnp.asarray(i), positions[:, i : i + 1], valid)
        out.append(int(jnp.argmax(logits[0, -1])))
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_the_family_tokenizer_decodes_the_models_continuation(family, tmp_path):
    source = HfSource.open(FIXTURES / family)
    source.copy_tokenizer(tmp_path)
    tokenizer = build_tokenizer(source.experiment(tmp_path).data, tmp_path)
    eos = json.loads((FIXTURES / family / "config.json").read_text()).get("eos_token_id")
    if eos is not None:
        assert tokenizer.eos_id in (eos if isinstance(eos, list) else [eos])
    ids = tokenizer.encode(PROMPT)
    assert tokenizer.decode(ids).strip() == PROMPT
    model, _ = imported_model(FIXTURES / family)
    prompt = np.asarray([ids], np.int32)
    continued = _greedy_with_the_cache(model, prompt, NEW_TOKENS)
    text = tokenizer.decode(ids + continued)
    assert text.startswith(tokenizer.decode(ids)) and len(text) > len(tokenizer.decode(ids))
