"""Bad requests to the server (pax_eqx/serving) found by probing it as a careless or hostile client
would (docs/errors.md, "Serving: bad requests"): each is one HTTP 400 naming the field, the value
and the fix -- not a 500 with a traceback in the log, a 429 retried forever, a megabyte of error
message, or a server that does not start -- and the next good request is answered.

In process through the ASGI app (httpx.ASGITransport), on a tiny language model (2 layers, 16
dims, weights drawn by numpy) with the byte tokenizer that every string encodes with, as the
shakespeare_char job dirs use."""

from __future__ import annotations

import asyncio
import json
import logging

import equinox as eqx
import httpx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_eqx import serve
from pax_eqx.data.tokenizers import ByteTokenizer
from pax_eqx.models import LanguageModelConfig
from pax_eqx.serving.backends import LanguageModelBackend
from pax_eqx.serving.http_app import make_app
from pax_eqx.serving.requests import QueueFull, Request

TOKENIZER = ByteTokenizer()
TINY_LM = LanguageModelConfig(
    vocab_size=TOKENIZER.vocab_size, max_seq_len=32, num_layers=2, model_dims=16, hidden_dims=32, num_heads=4
)


@pytest.fixture(scope="module")
def model():
    """`TINY_LM.build`'s model, traced (not run), its weights drawn by numpy."""
    shapes = eqx.filter_eval_shape(TINY_LM.build, jax.random.key(0))
    rng = np.random.default_rng(0)
    draw = lambda x: jnp.asarray(rng.normal(0.0, 0.2, x.shape), x.dtype)  # noqa: E731
    return jax.tree.map(draw, shapes, is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))


@pytest.fixture(scope="module")
def backend(model):
    b = LanguageModelBackend(model, TOKENIZER, slots=2, chunk=8, max_waiting=2)
    serve._warm_up(b)  # compiled as `pax_eqx.serve` compiles, before any request
    b.start()
    yield b
    b.stop(drain=False)


def post(app, *calls: tuple[str, bytes | dict]) -> list[httpx.Response]:
    """The answers to POST (route, body) in turn (raw bytes sent as they are)."""

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            out = []
            for route, body in calls:
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                out.append(await client.post(route, content=raw, headers={"Content-Type": "application/json"}))
            return out

    return asyncio.run(main())


GOOD = ("/v1/completions", {"prompt": "ROMEO:", "max_tokens": 3, "temperature": 0})


def test_a_lone_surrogate_anywhere_is_a_400_naming_where_not_a_500(backend, caplog):
    """JSON may escape half a UTF-16 pair ("\\ud800"): json.loads gives a str that UTF-8 cannot
    encode, and the byte tokenizer (or the answer's encoding) raised UnicodeEncodeError: a 500 with
    a traceback in the log; a field *name* holding one escaped the handler's guard altogether (a
    bare "Internal Server Error")."""
    app = make_app(backend, "tiny")
    cases = [  # (route, the body's JSON text, the field the error names)
        ("/v1/completions", r'{"prompt": "ab\ud800cd", "max_tokens": 2}', "prompt"),
        ("/v1/completions", r'{"prompt": ["ab", "c\udc00"], "max_tokens": 2, "echo": true}', "prompt[1]"),
        ("/v1/completions", r'{"prompt": "ab", "max_tokens": 2, "stop": ["x", "\ud800"]}', "stop[1]"),
        ("/v1/completions", r'{"prompt": "ab", "\ud800": 1}', "body"),
        ("/v1/chat/completions", r'{"messages": [{"role": "user", "content": "\udfff"}]}', "messages[0].content"),
        ("/v1/chat/completions", r'{"messages": [{"role": "\udfff", "content": "x"}]}', "messages[0].role"),
        ("/v1/chat/completions", r'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]}',
         "messages[0].content[0].text"),
    ]  # fmt: skip
    with caplog.at_level(logging.ERROR, logger="pax_eqx.serving"):
        *bad, good = post(app, *((route, text.encode()) for route, text, _ in cases), GOOD)
    for r, (_, text, field) in zip(bad, cases):
        assert r.status_code == 400, (text, r.status_code, r.text)
        error = r.json()["error"]
        assert error["param"] == field and "lone UTF-16 surrogate" in error["message"], (text, error)
        assert "send valid Unicode" in error["message"]
    assert not caplog.records  # no traceback in the server's log
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] >= 1
    # a pair is one character, and answered (the emoji's four bytes are four tokens)
    ok = post(app, ("/v1/completions", rb'{"prompt": "\ud83d\ude00", "max_tokens": 2}'))[0]
    assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens"] == 4


def test_an_error_echoes_at_most_a_short_cut_of_what_was_sent(backend):
    """A 100 kB value or field name, a 1 MB model name: the error quoted each whole (a 1 MB error
    body, and `param` holding the 100 kB name)."""
    app = make_app(backend, "tiny")
    answers = post(
        app,
        ("/v1/completions", {"prompt": "ab", "max_tokens": "9" * 100_000}),
        ("/v1/completions", {"prompt": "ab", "temperature": "t" * 100_000}),
        ("/v1/completions", {"prompt": "ab", "stream": "s" * 100_000}),
        ("/v1/completions", {"prompt": "ab", "f" * 100_000: 1}),
        ("/v1/completions", {"prompt": "ab", "model": "m" * 1_000_000}),
        ("/v1/completions", {"prompt": "ab", "best_of": "b" * 100_000}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": ["t" * 100_000]}),
    )
    for r, field in zip(answers, ("max_tokens", "temperature", "stream", "f" * 80, "model", "best_of", "tools")):
        error = r.json()["error"]
        assert 400 <= r.status_code < 500 and error["param"] == field, error["param"][:100]
        assert len(error["message"]) < 700 and "characters)" in error["message"], error["message"][:300]


def test_more_choices_than_the_server_ever_holds_is_a_400_not_a_429_forever(backend):
    """slots 2 + max_waiting 2: n=5 (or 5 prompts) could never be queued, so `Retry-After: 1` sent
    a retrying client round forever; n=4 fits, and is answered on an idle server (it was a 429:
    the queue's places did not count the free slots)."""
    app = make_app(backend, "tiny")
    n5, prompts5, chat5, n4, good = post(
        app,
        ("/v1/completions", {"prompt": "ab", "max_tokens": 2, "n": 5}),
        ("/v1/completions", {"prompt": ["a", "b", "c", "d", "e"], "max_tokens": 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "n": 5}),
        ("/v1/completions", {"prompt": "ab", "max_tokens": 2, "n": 4}),
        GOOD,
    )
    for r, field in ((n5, "n"), (prompts5, "prompt"), (chat5, "n")):
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
        assert "holds 4 requests at most" in r.json()["error"]["message"] and "--max-waiting" in r.text
    assert n4.status_code == 200 and len(n4.json()["choices"]) == 4
    assert good.status_code == 200


def test_max_waiting_0_serves_what_the_free_slots_take(model):
    """--max-waiting 0 (accepted by the flag check) was a traceback at the warm-up (its one request
    found the 0-place queue full) and, past that, a 429 for every request: the queue did not count
    the free slots. Now 0 means no queue beyond the slots."""
    backend = LanguageModelBackend(model, TOKENIZER, slots=2, chunk=8, max_waiting=0)
    serve._warm_up(backend)  # was QueueFull
    held = [backend.submit(Request((40, 41), max_tokens=2)) for _ in range(2)]  # one per free slot
    with pytest.raises(QueueFull):
        backend.submit(Request((40, 41), max_tokens=2))
    while backend.busy():
        backend.step()
    assert [c.result(0).reason for c in held] == ["length", "length"]
    backend.submit(Request((40, 41), max_tokens=2))  # the slots are free again
    backend.stop(drain=False)
