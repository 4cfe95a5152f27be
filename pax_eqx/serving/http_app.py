"""The HTTP server's app (Starlette, ASGI): the OpenAI API over a `Backend`, the page, the health
and metrics routes.

    GET  /                      a page to try the model (page.html)
    GET  /health                200 {"status": "ok"}; 503 while draining or after the backend failed
    GET  /metrics               Prometheus text (prometheus_text)
    GET  /v1/models             the one model served
    POST /v1/completions        OpenAI completions; "stream": true sends server-sent events
    POST /v1/chat/completions   OpenAI chat (the model's chat template, chat_template)
    POST /v1/classify           a classifier's labels and probabilities (classifier_backend)

Requests become backend Completions; the backend's thread reports each event through `notify`,
which wakes the request's coroutine on the event loop (`call_soon_threadsafe`): one thread
decodes for every request and no thread waits per request. A client that goes away (a closed
stream, a dropped connection) cancels its completions, so their slots free at the engine's next
step.

Errors are JSON in OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`): a bad
request 400 with `param` naming the field (openai_api), an unknown route 404, a body over
`max_body_bytes` 413, a full queue 429 with `Retry-After`, draining 503, a request past its
timeout 504, and anything unexpected 500 with one line (the traceback goes to the log). No
request's failure reaches the server: every handler's exceptions end in its own response.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import math
import queue
import secrets
import time
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from pax_eqx.serving import openai_api
from pax_eqx.serving.chat_template import ChatTemplate
from pax_eqx.serving.prometheus_text import CONTENT_TYPE, metrics_text
from pax_eqx.serving.requests import Completion, Finished, QueueFull, RequestError, ShuttingDown, Token

log = logging.getLogger("pax_eqx.serving")

MAX_BODY_BYTES = 8 << 20
_ROUTES = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "classify": "/v1/classify"}


class _Refusal(Exception):
    """An answer other than 200 decided inside a handler: status, OpenAI error body, headers."""

    def __init__(self, status: int, message: str, *, param: str | None = None, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.param, self.kind, self.headers = status, param, kind, headers or {}

    def response(self) -> JSONResponse:
        body = openai_api.error_body(str(self), param=self.param, kind=self.kind)
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def make_app(
    backend: Any, model_name: str, *, timeout_s: float = 600.0, chat_template: ChatTemplate | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> Starlette:  # fmt: skip
    """The app serving `backend` (backends.Backend) as `model_name`. timeout_s: the longest a
    request may take, queueing included. chat_template: how chat messages become a prompt
    (default: the tokenizer's template, else the plain fallback). `app.state.draining = True`
    (what `pax_eqx.serve` sets on SIGTERM) makes /health and new requests answer 503;
    `app.state.traffic.in_flight` counts the requests being answered."""
    if chat_template is None and "chat" in backend.endpoints:
        chat_template = ChatTemplate.for_tokenizer(backend.tokenizer)
    traffic = Traffic()

    def refuse_if_draining() -> None:
        if app.state.draining:
            raise _Refusal(503, "the server is shutting down (draining); send the request to another replica.",
                           kind="server_shutting_down")  # fmt: skip

    def check_model(body: Any) -> None:
        name = body.get("model") if isinstance(body, dict) else None
        if name is not None and name != model_name:
            raise _Refusal(404, f"model={openai_api.shown(name)} is not served here; this server serves {model_name!r} "
                           "(GET /v1/models).", param="model", kind="not_found_error")  # fmt: skip

    def served(endpoint: str) -> None:
        if endpoint not in backend.endpoints:
            offered = ", ".join(f"POST {_ROUTES[e]}" for e in sorted(backend.endpoints))
            raise _Refusal(404, f"this model does not answer {_ROUTES[endpoint]}; it answers {offered}.",
                           kind="not_found_error")  # fmt: skip

    async def page(request: Request) -> Response:
        return HTMLResponse(resources.files("pax_eqx.serving").joinpath("page.html").read_text())

    async def health(request: Request) -> Response:
        if backend.failure:
            return JSONResponse({"status": "failed", "reason": backend.failure}, status_code=503)
        if app.state.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok", "model": model_name})

    async def metrics(request: Request) -> Response:
        return Response(metrics_text(backend.stats(), traffic.responses), media_type=CONTENT_TYPE)

    async def models(request: Request) -> Response:
        card = {
            "id": model_name, "object": "model", "created": app.state.started, "owned_by": "pax_eqx",
            "max_model_len": backend.max_seq_len or None,
            "endpoints": [_ROUTES[e] for e in sorted(backend.endpoints)],
        }  # fmt: skip
        return JSONResponse({"object": "list", "data": [card]})

    async def completions(request: Request) -> Response:
        served("completions")
        body = await _json_body(request, max_body_bytes)
        check_model(body)
        ask = openai_api.parse_completion(body, backend.tokenizer, backend.room, timeout_s)
        return await answer(request, ask)

    async def chat(request: Request) -> Response:
        served("chat")
        body = await _json_body(request, max_body_bytes)
        check_model(body)
        ask = openai_api.parse_chat(body, backend.tokenizer, backend.room, chat_template, timeout_s)
        return await answer(request, ask)

    async def classify(request: Request) -> Response:
        served("classify")
        body = await _json_body(request, max_body_bytes)
        check_model(body)
        refuse_if_draining()
        result = await asyncio.to_thread(backend.classify, body)
        return JSONResponse({"id": "cls-" + secrets.token_hex(12), "model": model_name, **result})

    async def answer(request: Request, ask: openai_api.Ask) -> Response:
        refuse_if_draining()
        capacity = getattr(backend, "capacity", None)
        if capacity is not None and len(ask.requests) > capacity:  # a 429 would be retried forever
            prompts = len(ask.requests) // ask.n
            field = "n" if ask.n > 1 else "prompt"  # a chat has one prompt: only n can ask too much
            raise RequestError(field, f"{prompts} prompt(s) x n={ask.n} = {len(ask.requests)} choices, but this "
                               f"server holds {capacity} requests at most (pax_eqx.serve --slots + --max-waiting); "
                               "ask for fewer choices, or split the request.")  # fmt: skip
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()

        def notify() -> None:  # on the backend's thread
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop has closed (the server stopped): nobody is waiting
                pass

        submitted: list[Completion] = []
        try:
            for r in ask.requests:
                submitted.append(backend.submit(r, notify))
        except BaseException:
            for c in submitted:
                c.cancel()
            raise
        rid, created = openai_api.new_id(ask.kind), openai_api.now()
        if ask.stream:
            return _CancellingStream(
                _events(ask, submitted, wake, model_name, rid, created), submitted,
                media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )  # fmt: skip
        try:
            finals = await _results(request, submitted, wake)
        finally:
            for c in submitted:
                if c.finished is None:
                    c.cancel()
        if finals is None:  # the client went away; nobody reads this
            return Response(status_code=499)
        late = [f for f in finals if f.reason == "timeout"]
        if late:
            raise _Refusal(504, f"the request ran past the server's timeout of {timeout_s:g} s (pax_eqx.serve "
                           "--timeout-s), queueing included; ask for fewer max_tokens or retry later.",
                           kind="timeout")  # fmt: skip
        if any(f.reason == "cancelled" for f in finals):
            raise RuntimeError(backend.failure or "the request was cancelled by the server")
        return JSONResponse(openai_api.response(ask, finals, model_name, rid, created))

    routes = [
        Route("/", guarded(page), methods=["GET"]),
        Route("/health", guarded(health), methods=["GET"]),
        Route("/metrics", guarded(metrics), methods=["GET"]),
        Route("/v1/models", guarded(models), methods=["GET"]),
        Route("/v1/completions", guarded(completions), methods=["POST"]),
        Route("/v1/chat/completions", guarded(chat), methods=["POST"]),
        Route("/v1/classify", guarded(classify), methods=["POST"]),
    ]

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            message = f"no route {request.url.path}; the routes are {', '.join(r.path for r in routes)}."
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}."
        else:
            message = str(exc.detail)
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(openai_api.error_body(message, kind=kind), status_code=exc.status_code)

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    app.add_middleware(_CountTraffic, traffic=traffic)
    app.state.draining = False
    app.state.traffic = traffic
    app.state.started = openai_api.now()
    app.state.backend = backend
    return app


def guarded(handler: Callable) -> Callable:
    """`handler` whose every exception ends in a JSON answer: a RequestError 400 naming its
    field, QueueFull 429 with Retry-After, ShuttingDown 503, anything else 500 (logged)."""

    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except _Refusal as e:
            return e.response()
        except RequestError as e:
            return _Refusal(400, str(e), param=e.field).response()
        except QueueFull as e:
            retry = str(max(1, math.ceil(e.retry_after_s)))
            return _Refusal(429, str(e), kind="rate_limit_error", headers={"Retry-After": retry}).response()
        except ShuttingDown as e:
            return _Refusal(503, str(e), kind="server_shutting_down").response()
        except ClientDisconnect:
            return Response(status_code=499)
        except Exception as e:
            log.exception("error answering %s %s", request.method, request.url.path)
            line = f"{type(e).__name__}: {e}".splitlines()[0][:500]
            return _Refusal(500, f"the server failed on this request ({line}); it keeps serving others.",
                            kind="server_error").response()  # fmt: skip

    return run


async def _json_body(request: Request, limit: int) -> Any:
    """The request's JSON, read up to `limit` bytes (413 past it); RequestError("body") when it
    is not JSON (NaN and Infinity included: they are not JSON)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _Refusal(413, f"the body is {declared} bytes; the server reads {limit} at most.", param="body")
    chunks, size = [], 0
    async for piece in request.stream():
        size += len(piece)
        if size > limit:
            raise _Refusal(413, f"the body is over {limit} bytes; the server reads {limit} at most.", param="body")
        chunks.append(piece)
    raw = b"".join(chunks)

    def no_constants(name: str) -> None:
        raise ValueError(f"{name} is not a JSON number")

    try:
        body = json.loads(raw, parse_constant=no_constants)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        detail = str(e) if not isinstance(e, RecursionError) else "nested too deeply"
        raise RequestError("body", f"the body is not JSON ({detail[:200]}); send a JSON object.") from None
    _refuse_lone_surrogates(body)
    return body


def _refuse_lone_surrogates(body: Any) -> None:
    """RequestError naming the first string (a value or a field's name) holding a lone UTF-16
    surrogate: JSON lets a string escape half a pair ("\\ud800"), which is no character, and
    encoding it as UTF-8 (a tokenizer, the answer) would fail."""
    stack: collections.deque[tuple[str, Any]] = collections.deque([("", body)])
    while stack:
        path, value = stack.popleft()
        if isinstance(value, dict):
            for key, item in value.items():
                at = _surrogate_at(key)
                if at >= 0:
                    where = path or "body"
                    raise RequestError(where, f"a field name in {where} holds a lone UTF-16 surrogate ({key[at]!r}), "
                                       f"which is no character; {_SURROGATE_FIX}")  # fmt: skip
                stack.append((f"{path}.{key}" if path else key, item))
        elif isinstance(value, list):
            stack.extend((f"{path or 'body'}[{i}]", item) for i, item in enumerate(value))
        elif isinstance(value, str) and _surrogate_at(value) >= 0:
            at = _surrogate_at(value)
            raise RequestError(path or "body", f"{path or 'body'} holds a lone UTF-16 surrogate ({value[at]!r} at "
                               f"character {at}), which is no character; {_SURROGATE_FIX}")  # fmt: skip


_SURROGATE_FIX = "send valid Unicode (a character beyond U+FFFF is escaped as a pair, e.g. \\ud83d\\ude00)."


def _surrogate_at(text: str) -> int:
    """The index of the first lone surrogate in `text`, or -1."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return -1


async def _results(request: Request, submitted: list[Completion], wake: asyncio.Event) -> list[Finished] | None:
    """Every completion's Finished event, or None if the client disconnected first (checked
    twice a second while waiting)."""
    finals: list[Finished | None] = [None] * len(submitted)
    checked = time.monotonic()
    while any(f is None for f in finals):
        try:
            await asyncio.wait_for(wake.wait(), timeout=0.5)
        except TimeoutError:
            pass
        if time.monotonic() - checked >= 0.5:  # tokens may wake this more often than that
            if await request.is_disconnected():
                return None
            checked = time.monotonic()
        wake.clear()
        for i, c in enumerate(submitted):
            for event in _drain(c):
                if isinstance(event, Finished):
                    finals[i] = event
    return finals  # type: ignore[return-value]


def _drain(c: Completion) -> list[Any]:
    out = []
    while True:
        try:
            out.append(c.events.get_nowait())
        except queue.Empty:
            return out


async def _events(
    ask: openai_api.Ask, submitted: list[Completion], wake: asyncio.Event, model: str, rid: str, created: int
) -> AsyncIterator[str]:
    """The server-sent events of a streamed request: each choice's text as it comes, its finish
    reason, the usage if asked, then `data: [DONE]`. A comment line every second while nothing
    comes keeps proxies from closing the connection and finds a client that went away."""
    finals: list[Finished | None] = [None] * len(submitted)
    opened = [False] * len(submitted)

    def sse(obj: dict) -> str:
        return f"data: {json.dumps(obj)}\n\n"

    while any(f is None for f in finals):
        try:
            await asyncio.wait_for(wake.wait(), timeout=1.0)
        except TimeoutError:
            yield ": waiting\n\n"
            continue
        wake.clear()
        for i, c in enumerate(submitted):
            for event in _drain(c):
                if isinstance(event, Token) and (event.text or not opened[i]):
                    yield sse(openai_api.chunk(ask, i, model, rid, created, text=event.text, first=not opened[i]))
                    opened[i] = True
                elif isinstance(event, Finished):
                    if not opened[i]:
                        yield sse(openai_api.chunk(ask, i, model, rid, created, first=True))
                        opened[i] = True
                    finals[i] = event
                    yield sse(openai_api.chunk(ask, i, model, rid, created, finished=event))
    if ask.include_usage:
        yield sse(openai_api.usage_chunk(ask, finals, model, rid, created))  # type: ignore[arg-type]
    yield "data: [DONE]\n\n"


class _CancellingStream(StreamingResponse):
    """A streamed answer that cancels its completions when it ends early (the client went away,
    or the server stops): their slots free at the engine's next step."""

    def __init__(self, content: AsyncIterator[str], completions: list[Completion], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.completions = completions

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for c in self.completions:
                if c.finished is None:
                    c.cancel()


class Traffic:
    """The requests being answered (a streamed one until its last event) and the answers
    given by HTTP status (for /metrics)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.responses: collections.Counter[int] = collections.Counter()


class _CountTraffic:
    """ASGI middleware keeping `Traffic`."""

    def __init__(self, app: Any, traffic: Traffic) -> None:
        self.app, self.traffic = app, traffic

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counting(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.traffic.responses[message["status"]] += 1
            await send(message)

        self.traffic.in_flight += 1
        try:
            await self.app(scope, receive, counting)
        finally:
            self.traffic.in_flight -= 1
