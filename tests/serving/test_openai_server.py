"""The HTTP server (pax_eqx.serve, serving/http_app.py): the `openai` client talks to it
(completions, chat, streaming); 64 concurrent requests all complete with greedy outputs equal to
`generate`'s; a burst of bad requests gets 4xx JSON naming the field and leaves it healthy; a
full queue answers 429 with Retry-After; a client that goes away frees its slot; a request past
its timeout gets 504; an encoder-decoder and a classifier are served; and `python -m
pax_eqx.serve` on a job dir drains its requests on SIGTERM and exits 0.

The model is tiny (2 layers, 16 dims) with a character tokenizer, served by uvicorn on a free
port of 127.0.0.1 in a thread of the test process."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import equinox as eqx
import httpx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import uvicorn

from pax_eqx.config import ConfigError
from pax_eqx.models import GreedyStrategy, LanguageModelConfig, SampleConfig, generate
from pax_eqx.serving.backends import LanguageModelBackend
from pax_eqx.serving.chat_template import ChatTemplate
from pax_eqx.serving.http_app import make_app
from pax_eqx.serving.requests import Request, RequestError

openai = pytest.importorskip("openai")

FIXTURE_JOB = Path(__file__).parents[1] / "fixtures" / "job_dir_2026_11_25"


class Chars:
    """Token i is ALPHABET[i]; the last id is EOS (also BOS and pad: nothing here pads)."""

    ALPHABET = " \n:abcdefghijklmnopqrstuvwxyz"
    vocab_size = len(ALPHABET) + 1
    eos_id = bos_id = len(ALPHABET)
    pad_id = 0
    path = ""
    fingerprint = "chars"

    def token_bytes(self):
        return np.ones(self.vocab_size, np.int32)

    def encode(self, text):
        return [self.ALPHABET.index(c) for c in text]

    def decode(self, ids):
        return "".join(self.ALPHABET[i] for i in ids if 0 <= i < len(self.ALPHABET))

    def unknown_characters(self, text):
        return "".join(c for c in dict.fromkeys(text) if c not in self.ALPHABET)


TOKENIZER = Chars()


def quick_build(cfg, seed: int):
    """`cfg.build`'s model with weights drawn by numpy (normal, std 0.2): the build traced, not run
    (running a build's initialisers op by op takes seconds of CPU; these tests need a model, not
    its init)."""
    shapes = eqx.filter_eval_shape(cfg.build, jax.random.key(seed))
    rng = np.random.default_rng(seed)

    def draw(x):
        assert jnp.issubdtype(x.dtype, jnp.floating), x
        return jnp.asarray(rng.normal(0.0, 0.2, x.shape), x.dtype)

    return jax.tree.map(draw, shapes, is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))


TINY_LM = LanguageModelConfig(
    vocab_size=Chars.vocab_size, max_seq_len=48, num_layers=2, model_dims=16, hidden_dims=32, num_heads=4
)


@pytest.fixture(scope="module")
def model():
    return quick_build(TINY_LM, 0)


class Served:
    """An app on a free port of 127.0.0.1, run by uvicorn on a thread, its programs compiled
    first; `url`, `backend`, `app`."""

    def __init__(self, backend, name="tiny", **app_kwargs):
        self.backend, self.app = backend, make_app(backend, name, **app_kwargs)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off")
        self.server = uvicorn.Server(config)
        if "classify" not in backend.endpoints:  # compile before serving, as `pax_eqx.serve` does
            backend.submit(Request((1,), max_tokens=2, temperature=0.0))
            while backend.busy():
                backend.step()
        backend.start()
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.backend.stop(drain=False)


@pytest.fixture(scope="module")
def served(model):
    s = Served(LanguageModelBackend(model, TOKENIZER, slots=8, chunk=8, max_waiting=128))
    yield s
    s.close()


RNG = np.random.default_rng(0)
PROMPTS = ["".join(RNG.choice(list("abcdefghijklmnopqrstuvwxyz "), size=n)) for n in RNG.choice([3, 5, 11], size=64)]
CHAT_PROMPT = "system: x\nuser: hi\nassistant:"  # the plain fallback template's rendering of CHAT


@pytest.fixture(scope="module")
def greedy(model) -> dict[str, str]:
    """`generate`'s greedy 8 tokens after each prompt the tests send, in one call (one compile;
    left-padded, each row gives what it gives alone)."""
    prompts = [*PROMPTS, "the cat", CHAT_PROMPT]
    cfg = SampleConfig(max_new_tokens=8, eos_id=TOKENIZER.eos_id, strategy=GreedyStrategy())
    ids = generate(model, [TOKENIZER.encode(p) for p in prompts], cfg, jax.random.key(0))
    return {p: TOKENIZER.decode(i) for p, i in zip(prompts, ids)}


# The openai client -----------------------------------------------------------------------------
def test_the_openai_client_completes_chats_and_streams(served, greedy):
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0)
    want = greedy["the cat"]
    got = client.completions.create(model="tiny", prompt="the cat", max_tokens=8, temperature=0)
    assert got.choices[0].text == want and got.object == "text_completion" and got.model == "tiny"
    assert got.usage.prompt_tokens == 7 and got.usage.completion_tokens == len(want) or got.choices[0].finish_reason
    streamed = client.completions.create(model="tiny", prompt="the cat", max_tokens=8, temperature=0, stream=True)
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")

    # chat: the plain fallback template ("role: content" lines, then "assistant:")
    messages = [{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]
    want = greedy[CHAT_PROMPT]
    got = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
    assert got.choices[0].message.role == "assistant" and got.choices[0].message.content == want
    stream = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(CHAT_PROMPT)

    # n choices with seeds seed, seed + 1: each repeatable alone
    two = client.completions.create(model="tiny", prompt="ab", max_tokens=8, temperature=1.0, n=2, seed=5)
    again = client.completions.create(model="tiny", prompt="ab", max_tokens=8, temperature=1.0, seed=6)
    assert [c.index for c in two.choices] == [0, 1] and two.choices[1].text == again.choices[0].text
    assert client.models.list().data[0].id == "tiny"
    with pytest.raises(openai.BadRequestError, match="best_of"):
        client.completions.create(model="tiny", prompt="ab", best_of=3)


def test_64_concurrent_requests_all_complete_and_greedy_equals_generate(served, greedy):
    prompts = PROMPTS

    async def main():
        async with httpx.AsyncClient(base_url=served.url, timeout=60) as client:
            bodies = [{"model": "tiny", "prompt": p, "max_tokens": 8, "temperature": 0} for p in prompts]
            return await asyncio.gather(*(client.post("/v1/completions", json=b) for b in bodies))

    answers = asyncio.run(main())
    assert [a.status_code for a in answers] == [200] * 64
    texts = [a.json()["choices"][0]["text"] for a in answers]
    assert texts == [greedy[p] for p in prompts]
    assert len({a.json()["id"] for a in answers}) == 64
    assert served.backend.programs.trace_counts == {"prefill": 1, "generate": 1}


# Bad requests -----------------------------------------------------------------------------------
BAD = [  # (body or raw bytes, the field the error names; None: no field)
    (b"{not json", "body"),
    (b"[1, 2]", "body"),
    (b'{"prompt": NaN}', "body"),
    (b"\xff\xfe\x00garbage", "body"),
    (b"[" * 100_000 + b"]" * 100_000, "body"),
    ({"prompt": 3}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": "HELLO"}, "prompt"),  # not in the vocabulary
    ({"prompt": [1, 2, 999]}, "prompt"),
    ({"prompt": "ab" * 40}, "prompt"),  # too long for 48 positions
    ({"prompt": "ab", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "ab", "max_tokens": "ten"}, "max_tokens"),
    ({"prompt": "ab", "max_tokens": 1000}, "max_tokens"),
    ({"prompt": "ab", "max_tokens": True}, "max_tokens"),
    ({"prompt": "ab", "temperature": -0.5}, "temperature"),
    ({"prompt": "ab", "temperature": "hot"}, "temperature"),
    ({"prompt": "ab", "top_p": 0}, "top_p"),
    ({"prompt": "ab", "top_k": -3}, "top_k"),
    ({"prompt": "ab", "seed": -1}, "seed"),
    ({"prompt": "ab", "seed": 2**40}, "seed"),
    ({"prompt": "ab", "n": 0}, "n"),
    ({"prompt": "ab", "n": 10**9}, "n"),
    ({"prompt": "ab", "stop": 5}, "stop"),
    ({"prompt": "ab", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"prompt": "ab", "stream": "yes"}, "stream"),
    ({"prompt": "ab", "best_of": 4}, "best_of"),
    ({"prompt": "ab", "use_beam_search": True}, "use_beam_search"),
    ({"prompt": "ab", "num_beams": 4}, "num_beams"),
    ({"prompt": "ab", "frequency_penalty": 0.5}, "frequency_penalty"),
    ({"prompt": "ab", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "ab", "temprature": 0.5}, "temprature"),
    ({"prompt": "ab", "model": "gpt-4"}, "model"),
]
BAD_CHAT = [
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": 3, "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "max_completion_tokens": 3},
     "max_completion_tokens"),
]  # fmt: skip


def test_a_burst_of_bad_requests_gets_4xx_naming_the_field_and_the_server_stays_healthy(served):
    with httpx.Client(base_url=served.url, timeout=30) as client:
        cases = [(b, f, "/v1/completions") for b, f in BAD] + [(b, f, "/v1/chat/completions") for b, f in BAD_CHAT]
        for body, field, route in cases:
            r = client.post(route, content=body) if isinstance(body, bytes) else client.post(route, json=body)
            assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
            error = r.json()["error"]
            assert error["param"] == field, (body, error)
            assert field.split("[")[0] in error["message"] or field == "body", (body, error)
        assert (
            client.get("/v1/nothing").status_code == 404 and "routes" in client.get("/v1/x").json()["error"]["message"]
        )
        assert client.get("/v1/completions").status_code == 405
        assert client.post("/v1/classify", json={"input": [1]}).status_code == 404  # an LM does not classify
        assert client.post("/v1/completions", content=b"x" * (9 << 20)).status_code == 413
        assert client.get("/health").json() == {"status": "ok", "model": "tiny"}
        ok = client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 2
        metrics = client.get("/metrics").text
    assert 'pax_eqx_http_responses_total{code="400"} ' in metrics
    samples = {line.split(" ")[0]: float(line.split(" ")[1]) for line in metrics.splitlines() if line[:1] != "#"}
    assert samples["pax_eqx_queue_depth"] == 0 and samples["pax_eqx_slots"] == 8
    assert samples['pax_eqx_request_latency_seconds{quantile="0.5"}'] > 0


# Load and faults --------------------------------------------------------------------------------
def test_a_full_queue_answers_429_with_retry_after_and_draining_answers_503(model):
    backend = LanguageModelBackend(model, TOKENIZER, slots=1, chunk=8, max_waiting=2)  # not started: nothing runs
    app = make_app(backend, "tiny")
    waiting = [backend.submit(Request((1, 2), max_tokens=2)) for _ in range(3)]  # the free slot's, the queue's 2

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            full = await client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2})
            app.state.draining = True
            draining = await client.post("/v1/completions", json={"prompt": "ab"})
            health = await client.get("/health")
            return full, draining, health

    full, draining, health = asyncio.run(main())
    assert full.status_code == 429 and int(full.headers["Retry-After"]) >= 1
    assert full.json()["error"]["type"] == "rate_limit_error"
    assert draining.status_code == 503 and health.status_code == 503 and health.json()["status"] == "draining"
    for c in waiting:
        c.cancel()


class Slow(LanguageModelBackend):
    """A step every `delay` seconds (100 ms: a client has time to hang up mid-request)."""

    delay = 0.1

    def step(self):
        time.sleep(self.delay)
        super().step()


@pytest.fixture(scope="module")
def slow(model):
    backend = Slow(model, TOKENIZER, slots=8, chunk=8)  # as `served`'s: the programs' compiles are cached
    backend.seen = []
    submit = backend.submit

    def recording(request, notify=None):
        c = submit(request, notify)
        backend.seen.append(c)
        return c

    backend.submit = recording
    s = Served(backend, timeout_s=1.5)
    yield s
    s.close()


def _wait_finished(completion, seconds=5.0):
    deadline = time.monotonic() + seconds
    while completion.finished is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return completion.finished


def test_a_client_that_goes_away_frees_its_slot(slow):
    body = {"model": "tiny", "prompt": "ab", "max_tokens": 25, "temperature": 0, "stream": True}
    with httpx.Client(base_url=slow.url, timeout=10) as client:
        with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            next(r.iter_lines())  # the first event, then the client hangs up
    finished = _wait_finished(slow.backend.seen[-1])
    assert finished is not None and finished.reason == "cancelled" and finished.completion_tokens < 25
    with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=slow.url, timeout=0.3) as client:
        client.post("/v1/completions", json={**body, "stream": False})  # not streamed: gone while it waits
    finished = _wait_finished(slow.backend.seen[-1])
    assert finished is not None and finished.reason == "cancelled" and finished.completion_tokens < 25
    assert not slow.backend.busy()


def test_a_request_past_its_timeout_gets_504(slow):
    """Steps of 2 s: any request, even one whose first token is EOS, outlasts the 1.5 s timeout."""
    slow.backend.delay = 2.0
    try:
        r = httpx.post(slow.url + "/v1/completions", json={"prompt": "ab", "max_tokens": 25}, timeout=10)
    finally:
        slow.backend.delay = Slow.delay
    assert r.status_code == 504 and "--timeout-s" in r.json()["error"]["message"]
    assert httpx.get(slow.url + "/health").status_code == 200


# Chat templates ---------------------------------------------------------------------------------
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_the_chat_template_comes_from_the_tokenizers_config_and_is_sandboxed(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML, "eos_token": "</s>"}))

    class Tok:
        path = str(tmp_path / "tokenizer.json")

    t = ChatTemplate.for_tokenizer(Tok())
    text = t.render([{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    refusing = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(RequestError, match="roles must alternate") as e:
        refusing.render([{"role": "user", "content": "hi"}])
    assert e.value.field == "messages"
    with pytest.raises(RequestError):  # the sandbox: no Python internals
        ChatTemplate("{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}").render([])
    assert ChatTemplate.for_tokenizer(TOKENIZER).is_fallback
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% for m in messages %}"}))
    with pytest.raises(ConfigError, match="does not compile"):  # the server refuses to start, in one line
        ChatTemplate.for_tokenizer(Tok())


# Other kinds of model ---------------------------------------------------------------------------
def test_an_encoder_decoder_answers_completions_with_one_program():
    from pax_eqx.models.decoding import sample
    from pax_eqx.models.sequence_model import SequenceModelConfig
    from pax_eqx.serving.seq2seq_backend import Seq2SeqBackend

    cfg = SequenceModelConfig(vocab_size=Chars.vocab_size + 2, max_seq_len=16, num_encoder_layers=1,
                              num_decoder_layers=1, model_dims=16, hidden_dims=32, num_heads=2)  # fmt: skip
    model = quick_build(cfg, 1)
    backend = Seq2SeqBackend(model, TOKENIZER, vocab_size=cfg.vocab_size)
    app = make_app(backend, "t5")

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            backend.start()
            got = [await client.post("/v1/completions", json={"prompt": p, "max_tokens": n, "temperature": 0})
                   for p, n in (("the cat<extra_id_0>", 6), ("ab", 9))]  # fmt: skip
            chat = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
            return got, chat

    got, chat = asyncio.run(main())
    backend.stop()
    # the decode CLI's greedy decoding of both inputs, in one batch (one compile), cut to each one's max_tokens
    asks = (("the cat<extra_id_0>", 6), ("ab", 9))
    decoder = model.incremental_decoder([backend.tokenizer.encode(p) for p, _ in asks], 9, 0, TOKENIZER.bos_id)
    greedy = SampleConfig(max_new_tokens=9, eos_id=TOKENIZER.eos_id, strategy=GreedyStrategy())
    tokens = np.asarray(sample(decoder, greedy, jax.random.key(0))[0])
    for r, row, (_, n) in zip(got, tokens, asks):
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == backend.tokenizer.decode(row[:n])
    assert chat.status_code == 404 and "/v1/completions" in chat.json()["error"]["message"]
    assert backend.trace_counts == {"decode": 1}


def test_a_classifier_answers_labels_and_probabilities():
    from pax_eqx.layers.base import Context, Mode, init
    from pax_eqx.layers.mlps import MLPConfig
    from pax_eqx.models.classification_model import ClassificationModelConfig
    from pax_eqx.serving.classifier_backend import ClassifierBackend

    network = MLPConfig(hidden_dims=(8,), batch_norm=True)  # moving statistics: a non-trainable state
    cfg = ClassificationModelConfig(input_shape=(4,), num_classes=3, network=network)
    model, state = init(cfg, jax.random.key(2))
    backend = ClassifierBackend(model, (4,), state=state, batch=4)
    app = make_app(backend, "digits")
    x = np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32)

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            many = await client.post("/v1/classify", json={"input": x.tolist(), "top_k": 3})
            one = await client.post("/v1/classify", json={"input": x[0].tolist()})
            bodies = ({"input": [1, 2]}, {"input": "x"}, {}, {"input": x[0].tolist(), "top_k": 9}, {"inputs": 1})
            bad = [await client.post("/v1/classify", json=b) for b in bodies]
            completion = await client.post("/v1/completions", json={"prompt": "a"})
            return many, one, bad, completion

    many, one, bad, completion = asyncio.run(main())
    _, want = model.predict({"inputs": x}, Context(state=state, mode=Mode.EVAL))
    data = many.json()["data"]
    assert len(data) == 10 and one.json()["data"][0] == {**data[0]}
    for d, p in zip(data, np.asarray(want)):
        assert d["labels"][0] == d["label"] == str(int(np.argmax(p)))
        np.testing.assert_allclose(sorted(d["probabilities"], reverse=True), sorted(p, reverse=True), rtol=1e-5)
    assert [b.json()["error"]["param"] for b in bad] == ["input", "input", "input", "top_k", "inputs"]
    assert completion.status_code == 404
    assert backend.trace_counts == {"predict": 1}


# The command line -------------------------------------------------------------------------------
def test_serve_on_a_job_dir_drains_its_requests_on_sigterm_and_exits_0(tmp_path):
    """A tiny shakespeare_char job dir (4 trained steps): `python -m pax_eqx.serve` answers, then
    SIGTERM while 24 requests are in flight on one slot: new requests get 503, every request in
    flight is answered in full, and the process exits 0."""
    job = tmp_path / "job"
    shutil.copytree(FIXTURE_JOB, job)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pax_eqx.serve", "--job-log-dir", str(job), "--port", "0", "--slots", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert line.startswith("Serving job (language model, 1 slots"), line + proc.stderr.read()
        url = re.search(r"http://\S+", line).group(0)
        body = {"prompt": "ROMEO:", "max_tokens": 56, "temperature": 0}

        async def main():
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                flight = [asyncio.ensure_future(client.post("/v1/completions", json=body)) for _ in range(24)]
                await asyncio.wait(flight, return_when=asyncio.FIRST_COMPLETED)  # 23 still queued or running
                proc.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.2)
                late = await client.post("/v1/completions", json=body)
                return await asyncio.gather(*flight), late

        answers, late = asyncio.run(main())
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    finally:
        proc.kill()
    assert late.status_code == 503 and "shutting down" in late.json()["error"]["message"]
    assert [a.status_code for a in answers] == [200] * 24
    assert len({a.json()["choices"][0]["text"] for a in answers}) == 1  # greedy: all in full, all the same
    assert len({a.json()["usage"]["completion_tokens"] for a in answers}) == 1
