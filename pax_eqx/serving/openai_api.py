"""The OpenAI API's request bodies checked and turned into `Request`s, and its responses built.

    ask = parse_completion(body, tokenizer, room, timeout_s)     # POST /v1/completions
    ask = parse_chat(body, tokenizer, room, template, timeout_s)  # POST /v1/chat/completions
    ask.requests: one Request per choice, prompt-major (choice i * n + j is prompt i's j-th)

Everything a client sends is checked here, before anything is queued, and a problem is a
RequestError naming the field (HTTP 400 with `error.param` = the field): a wrong type (a bool is
not a number, a string not a list), a value out of range, a prompt that leaves no room for one new
token, characters the tokenizer cannot encode, and fields the server does not do. The OpenAI
fields a client library sends with their neutral values (`logprobs: null`, `frequency_penalty: 0`,
`best_of: 1`) are accepted; any other value of them is refused with what to send instead, and a
field this API does not have is refused by name (a typo, or a knob of another server such as
`num_beams`): a request is never answered as if a setting took effect when it did not.

Beam search is refused (`best_of` > 1, `use_beam_search`, `num_beams`, `length_penalty`...): the
server decodes each request in its own slot, one token a step; `python -m pax_eqx.decode
--strategy beam` searches beams. `top_k` is pax_eqx's extension (0 = off), traced per request as
temperature and top_p are.

Seeds: `seed` makes a request repeatable (the same seed, the same text, whatever else shares the
batch); `n` > 1 gives the choices seeds seed, seed + 1, ...; without a seed each choice draws a
random one. Temperature 0 is greedy.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pax_eqx.config import SEED_MAX
from pax_eqx.serving.requests import Finished, Request, RequestError

MAX_N = 16  # choices of one prompt
MAX_CHOICES = 64  # choices of one request (prompts x n)
MAX_STOP = 4  # stop strings, as OpenAI
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions

_BEAM_FIELDS = ("num_beams", "beam_width", "beam_size", "length_penalty", "early_stopping", "num_beam_groups")
_BEAM_FIX = (
    "the server samples or decodes greedily, one slot per request, and does no beam search; send it without "
    "this field, or search beams with python -m pax_eqx.decode --strategy beam --beam-size N."
)

# Fields OpenAI has that the server does not do, with the values that ask for nothing (accepted).
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "best_of": (None, 1),
    "use_beam_search": (None, False),
}
_NEUTRAL_COMPLETION = {**_NEUTRAL, "logprobs": (None, 0), "suffix": (None, "")}
_NEUTRAL_CHAT = {
    **_NEUTRAL, "logprobs": (None, False), "top_logprobs": (None, 0), "tools": (None, []),
    "tool_choice": (None, "none", "auto"), "response_format": (None, {"type": "text"}), "store": (None, False),
    "modalities": (None, ["text"]),
}  # fmt: skip
_ANY_VALUE = ("user", "metadata", "parallel_tool_calls", "service_tier")  # informational; ignored
_COMMON = ("model", "max_tokens", "temperature", "top_p", "top_k", "n", "stream", "stream_options", "stop", "seed")
_COMPLETION_FIELDS = frozenset((*_COMMON, "prompt", "echo", *_ANY_VALUE, *_NEUTRAL_COMPLETION))
_CHAT_FIELDS = frozenset((*_COMMON, "messages", "max_completion_tokens", *_ANY_VALUE, *_NEUTRAL_CHAT))

Kind = Literal["completion", "chat"]


@dataclasses.dataclass(frozen=True)
class Ask:
    """A checked request: `requests` (one per choice, prompt-major), the prompts' texts (for
    `echo`), whether to stream and to end the stream with the usage, and the prompts' token counts."""

    kind: Kind
    requests: tuple[Request, ...]
    n: int
    prompt_texts: tuple[str, ...]
    prompt_tokens: tuple[int, ...]
    stream: bool = False
    include_usage: bool = False
    echo: bool = False


# Parsing ----------------------------------------------------------------------------------------
def parse_completion(body: Any, tokenizer: Any, room: Callable[[int], int], timeout_s: float) -> Ask:
    """POST /v1/completions: `prompt` is a string, a list of strings, a list of token ids or a
    list of lists of them. room(prompt tokens) -> the most new tokens the model has room for."""
    body = _object(body)
    _refuse_unknown(body, _COMPLETION_FIELDS, "/v1/completions")
    _refuse_beams_and_unsupported(body, _NEUTRAL_COMPLETION)
    prompts = _prompts(body.get("prompt"), tokenizer)
    echo = _bool(body, "echo", False)
    return _ask("completion", body, prompts, tokenizer, room, timeout_s, "prompt", "max_tokens",
                DEFAULT_COMPLETION_TOKENS, echo)  # fmt: skip


def parse_chat(body: Any, tokenizer: Any, room: Callable[[int], int], template: Any, timeout_s: float) -> Ask:
    """POST /v1/chat/completions: `messages` rendered by `template` (chat_template.ChatTemplate)
    into one prompt; `max_completion_tokens` is `max_tokens`' newer name. Without either, the
    answer may fill the model's context."""
    body = _object(body)
    _refuse_unknown(body, _CHAT_FIELDS, "/v1/chat/completions")
    _refuse_beams_and_unsupported(body, _NEUTRAL_CHAT)
    messages = _messages(body.get("messages"))
    text = template.render(messages)
    _check_encodable(tokenizer, text, "messages")
    ids = template.encode_rendered(tokenizer, text)
    field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise RequestError("max_completion_tokens", "give max_tokens or max_completion_tokens, not both.")
    return _ask("chat", body, [(text, ids)], tokenizer, room, timeout_s, "messages", field, None, False)


def _ask(
    kind: Kind, body: dict, prompts: list[tuple[str, list[int]]], tokenizer: Any, room: Callable[[int], int],
    timeout_s: float, prompt_field: str, max_field: str, default_max: int | None, echo: bool,
) -> Ask:  # fmt: skip
    n = _int(body, "n", 1, lo=1, hi=MAX_N)
    if len(prompts) * n > MAX_CHOICES:
        raise RequestError(
            "n", f"{len(prompts)} prompts x n={n} = {len(prompts) * n} choices; ask for at most {MAX_CHOICES}."
        )
    temperature = _number(body, "temperature", 1.0, lo=0.0, hi=100.0)
    top_p = _number(body, "top_p", 1.0, lo=0.0, hi=1.0, lo_open=True)
    top_k = _int(body, "top_k", 0, lo=0, hi=2**31 - 1)
    seed = _int(body, "seed", None, lo=0, hi=SEED_MAX)
    stop = _stop(body.get("stop"))
    asked = _int(body, max_field, None, lo=1, hi=2**31 - 1)
    stream = _bool(body, "stream", False)
    include_usage = _stream_options(body.get("stream_options"), stream)
    requests = []
    for i, (_, ids) in enumerate(prompts):
        where = prompt_field if len(prompts) == 1 else f"{prompt_field}[{i}]"
        left = room(len(ids))
        if left < 1:
            raise RequestError(
                where, f"the prompt is {len(ids)} tokens: no room is left for an answer in the model's context "
                "(GET /v1/models gives its max_model_len); shorten it.",
            )  # fmt: skip
        max_tokens = min(default_max or left, left) if asked is None else asked
        if max_tokens > left:
            raise RequestError(
                max_field, f"{max_field}={max_tokens}, but a prompt of {len(ids)} tokens leaves room for {left} new "
                f"tokens; ask for at most {left} or shorten the prompt.",
            )  # fmt: skip
        for j in range(n):
            s = secrets.randbelow(SEED_MAX + 1) if seed is None else (seed + j) % (SEED_MAX + 1)
            requests.append(Request(tuple(ids), max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                                    top_p=top_p, seed=s, stop=stop, timeout_s=timeout_s))  # fmt: skip
    return Ask(kind, tuple(requests), n, tuple(t for t, _ in prompts), tuple(len(ids) for _, ids in prompts),
               stream, include_usage, echo)  # fmt: skip


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise RequestError("body", f"the body is JSON {_kind(body)}; send a JSON object of the request's fields.")
    return body


def _refuse_unknown(body: dict, known: frozenset[str], route: str) -> None:
    for name in body:
        if name in _BEAM_FIELDS:
            raise RequestError(name, f"{name}: {_BEAM_FIX}")
        if name not in known:
            fields = ", ".join(sorted(known))
            message = f"{route} has no field {shown(name)}; its fields are {fields} (docs/serve.md)."
            raise RequestError(name[:80], message)


def _refuse_beams_and_unsupported(body: dict, neutral: dict[str, tuple[Any, ...]]) -> None:
    if body.get("use_beam_search") not in (None, False):
        raise RequestError("use_beam_search", f"use_beam_search={shown(body['use_beam_search'])}: {_BEAM_FIX}")
    best_of = body.get("best_of")
    if best_of is not None and not (type(best_of) is int and best_of == 1):
        raise RequestError("best_of", f"best_of={shown(best_of)} asks for the best of several (a search): {_BEAM_FIX}")
    for name, values in neutral.items():
        if name in body and not any(_same(body[name], v) for v in values):
            accepted = " or ".join("null" if v is None else repr(v) for v in values)
            raise RequestError(
                name, f"{name}={shown(body[name])} is not supported by this server; leave it out or send {accepted}."
            )


def _same(a: Any, b: Any) -> bool:
    """a == b as JSON sees it: 0 and 0.0 are the same, false and 0 are not."""
    number = lambda x: type(x) in (int, float)
    return (type(a) is type(b) or number(a) and number(b)) and a == b


def shown(value: Any, limit: int = 80) -> str:
    """`repr(value)`, cut to `limit` characters: an error echoes what was sent, not megabytes of it."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
             int: "a number", float: "a number"}  # fmt: skip
    return names.get(type(value), type(value).__name__)


def _int(body: dict, name: str, default: int | None, *, lo: int, hi: int) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if type(value) is not int:
        raise RequestError(name, f"{name} is {_kind(value)} ({shown(value)}); send a whole number from {lo} to {hi}.")
    if not lo <= value <= hi:
        raise RequestError(name, f"{name}={value} is out of range; send a whole number from {lo} to {hi}.")
    return value


def _number(body: dict, name: str, default: float, *, lo: float, hi: float, lo_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if type(value) not in (int, float) or not math.isfinite(value):
        raise RequestError(name, f"{name} is {_kind(value)} ({shown(value)}); send a number from {lo:g} to {hi:g}.")
    if (value <= lo if lo_open else value < lo) or value > hi:
        span = f"({lo:g}, {hi:g}]" if lo_open else f"[{lo:g}, {hi:g}]"
        raise RequestError(name, f"{name}={value!r} is out of range; send a number in {span}.")
    return float(value)


def _bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(name, f"{name} is {_kind(value)} ({shown(value)}); send true or false.")
    return value


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise RequestError("stop", f"stop is {_kind(value)}; send a string or a list of up to {MAX_STOP} strings.")
    if len(stops) > MAX_STOP:
        raise RequestError("stop", f"stop has {len(stops)} strings; send at most {MAX_STOP}.")
    return tuple(stops)


def _stream_options(value: Any, stream: bool) -> bool:
    if value is None:
        return False
    if not isinstance(value, dict) or set(value) - {"include_usage"}:
        raise RequestError("stream_options", 'stream_options takes {"include_usage": true|false} only.')
    if not stream:
        raise RequestError("stream_options", "stream_options needs stream: true.")
    return _bool(value, "include_usage", False)


def _check_encodable(tokenizer: Any, text: str, field: str) -> None:
    bad = tokenizer.unknown_characters(text)
    if bad:
        raise RequestError(field, f"{field} has characters outside the vocabulary: {bad[:20]!r}; remove them.")


def _prompts(value: Any, tokenizer: Any) -> list[tuple[str, list[int]]]:
    """(text, ids) of each prompt: a string, a list of strings, a list of ids, a list of lists."""
    fix = "send a string, a list of strings, a list of token ids or a list of lists of token ids."
    if value is None:
        raise RequestError("prompt", f"prompt is missing; {fix}")
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, list) and value and all(type(t) is int for t in value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise RequestError("prompt", f"prompt is {_kind(value) if value != [] else 'an empty list'}; {fix}")
    if len(value) > MAX_CHOICES:
        raise RequestError("prompt", f"prompt is a list of {len(value)} prompts; send at most {MAX_CHOICES}.")
    out = []
    for i, p in enumerate(value):
        where = "prompt" if len(value) == 1 else f"prompt[{i}]"
        if isinstance(p, str):
            if not p:
                raise RequestError(where, "the prompt is empty; send at least one character.")
            _check_encodable(tokenizer, p, where)
            out.append((p, tokenizer.encode(p)))
        elif isinstance(p, list) and p and all(type(t) is int for t in p):
            bad = [t for t in p if not 0 <= t < tokenizer.vocab_size]
            if bad:
                vocab = tokenizer.vocab_size
                raise RequestError(where, f"{where} has token ids {bad[:5]} outside the vocabulary [0, {vocab}).")
            out.append((tokenizer.decode(p), list(p)))
        else:
            raise RequestError(where, f"{where} is {_kind(p)}; {fix}")
    return out


def _messages(value: Any) -> list[dict[str, str]]:
    """[{"role", "content"}] with text content (a string, or a list of {"type": "text"} parts)."""
    if not isinstance(value, list) or not value:
        raise RequestError("messages", 'messages must be a non-empty list of {"role": ..., "content": ...} objects.')
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(where, f'{where} is {_kind(m)}; send {{"role": "user", "content": "..."}}.')
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not role:
            raise RequestError(f"{where}.role", f"{where}.role must be a string such as 'system', 'user', 'assistant'.")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise RequestError(
                        f"{where}.content[{j}]",
                        f'{where}.content[{j}]: text parts only ({{"type": "text", "text": ...}})',
                    )  # fmt: skip
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise RequestError(f"{where}.content", f"{where}.content is {_kind(content)}; send a string.")
        out.append({"role": role, "content": content})
    return out


# Responses --------------------------------------------------------------------------------------
def new_id(kind: Kind) -> str:
    return ("cmpl-" if kind == "completion" else "chatcmpl-") + secrets.token_hex(12)


def usage(ask: Ask, finals: Sequence[Finished]) -> dict[str, int]:
    """The prompts' tokens (each prompt once, whatever n) and every choice's new tokens."""
    prompt = sum(ask.prompt_tokens)
    completion = sum(f.completion_tokens for f in finals)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def finish_reason(f: Finished) -> str:
    """OpenAI's words: "stop" (EOS or a stop string), "length" (max_tokens); "timeout" and
    "cancelled" are the server's own (a streamed request that ran past its time, a drain)."""
    return f.reason


def response(ask: Ask, finals: Sequence[Finished], model: str, rid: str, created: int) -> dict[str, Any]:
    """The whole answer of a request that did not stream."""
    choices = []
    for i, f in enumerate(finals):
        if ask.kind == "completion":
            text = (ask.prompt_texts[i // ask.n] if ask.echo else "") + f.text
            choices.append({"index": i, "text": text, "logprobs": None, "finish_reason": finish_reason(f)})
        else:
            choices.append({"index": i, "message": {"role": "assistant", "content": f.text}, "logprobs": None,
                            "finish_reason": finish_reason(f)})  # fmt: skip
    obj = "text_completion" if ask.kind == "completion" else "chat.completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": choices,
            "usage": usage(ask, finals)}  # fmt: skip


def chunk(
    ask: Ask, index: int, model: str, rid: str, created: int, *, text: str = "", first: bool = False,
    finished: Finished | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One server-sent event of a streamed request: choice `index`'s new text (a chat's first
    chunk of a choice opens the assistant's message; a completion's carries the prompt under
    `echo`), or its finish reason."""
    reason = finish_reason(finished) if finished is not None else None
    if ask.kind == "completion":
        if first and ask.echo:
            text = ask.prompt_texts[index // ask.n] + text
        choice: dict[str, Any] = {"index": index, "text": text, "logprobs": None, "finish_reason": reason}
        obj = "text_completion"
    else:
        delta: dict[str, Any] = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}
        obj = "chat.completion.chunk"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}


def usage_chunk(ask: Ask, finals: Sequence[Finished], model: str, rid: str, created: int) -> dict[str, Any]:
    """The last event under `stream_options: {"include_usage": true}`: no choices, the usage."""
    obj = "text_completion" if ask.kind == "completion" else "chat.completion.chunk"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
            "usage": usage(ask, finals)}  # fmt: skip


def error_body(message: str, *, param: str | None = None, kind: str = "invalid_request_error",
               code: str | None = None) -> dict[str, Any]:  # fmt: skip
    """OpenAI's error object: `param` is the field to fix (None when no field is at fault)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def now() -> int:
    return int(time.time())
