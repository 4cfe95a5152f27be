"""Chat messages turned into one prompt: the model's own Jinja chat template, or a plain fallback.

A chat model is trained on conversations written in one exact form (ChatML's `<|im_start|>user`,
Llama 3's `<|start_header_id|>`...); a prompt in any other form gets worse answers. Hugging Face
keeps that form as a Jinja template in the tokenizer's config, and `import_hf` copies
`tokenizer_config.json` next to `tokenizer.json` (JOB_DIR/tokenizer/), so the template is read
from there (`chat_template`: a string, or a list of named templates of which "default" is used;
a `chat_template.jinja` file beside it wins, as in newer Hugging Face releases). It is rendered as
`transformers`' `apply_chat_template` renders it: a sandboxed environment (a template is code
from a model's author: no attribute access to Python internals), `trim_blocks` and
`lstrip_blocks`, the loop controls, `raise_exception(...)` and `strftime_now(...)`, with
`messages`, `add_generation_prompt=True`, `bos_token` and `eos_token`.

A model without a template (one trained here, a base model) gets the plain fallback, one line a
message and the assistant's turn opened:

    system: You are terse.
    user: Hi!
    assistant:

The template's text is encoded as any prompt is; a template that writes the BOS token itself,
followed by a tokenizer that adds one too, would give two: the duplicate is dropped
(`encode_rendered`).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from pax_eqx.config import ConfigError
from pax_eqx.extras import require
from pax_eqx.serving.requests import RequestError

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"


class ChatTemplate:
    """`render(messages) -> str`. text: the Jinja template text, or None for the fallback.
    messages: [{"role": str, "content": str}, ...] (already checked by openai_api)."""

    def __init__(self, text: str | None = None, *, bos_token: str = "", eos_token: str = "") -> None:
        self.text = text
        self.bos_token, self.eos_token = bos_token, eos_token
        self._template = None if text is None else _compile(text)

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> ChatTemplate:
        """The template of the tokenizer's config (beside its file, `tokenizer.path`), else the
        fallback. A config that cannot be read or a template that does not compile is a
        ConfigError naming the file (the server does not start with a broken template)."""
        path = getattr(tokenizer, "path", "") or ""
        folder = Path(path).parent if path else None
        if folder is None:
            return cls()
        config: dict[str, Any] = {}
        if (folder / CONFIG_FILE).is_file():
            try:
                config = json.loads((folder / CONFIG_FILE).read_text())
            except (OSError, ValueError) as e:
                raise ConfigError(f"{folder / CONFIG_FILE} is not readable JSON ({e}); fix or remove it.") from None
        text = config.get("chat_template")
        if isinstance(text, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
            named = {t.get("name"): t.get("template") for t in text if isinstance(t, dict)}
            text = named.get("default")
        if (folder / TEMPLATE_FILE).is_file():
            text = (folder / TEMPLATE_FILE).read_text()
        if not isinstance(text, str) or not text.strip():
            return cls()
        try:
            bos, eos = _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
            return cls(text, bos_token=bos, eos_token=eos)
        except Exception as e:  # jinja2.TemplateSyntaxError and the like
            raise ConfigError(f"the chat template of {folder} does not compile ({e}); fix {CONFIG_FILE}.") from None

    @property
    def is_fallback(self) -> bool:
        return self._template is None

    def render(self, messages: list[dict[str, str]]) -> str:
        """The prompt for `messages`, ending where the assistant's answer begins. A template that
        refuses the messages (`raise_exception("roles must alternate")`) or fails is a
        RequestError on `messages` with its words."""
        if self._template is None:
            return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=True, bos_token=self.bos_token, eos_token=self.eos_token
            )
        except _TemplateRefusal as e:
            raise RequestError("messages", f"the model's chat template refuses these messages: {e}") from None
        except Exception as e:  # an error inside the template's own code (a missing key, a type)
            raise RequestError(
                "messages", f"the model's chat template failed on these messages ({type(e).__name__}: {e})."
            ) from None

    def encode_rendered(self, tokenizer: Any, text: str) -> list[int]:
        """`tokenizer.encode(text)`, less a second BOS when the template wrote one and the
        tokenizer added its own."""
        ids = tokenizer.encode(text)
        bos = getattr(tokenizer, "bos_id", None)
        if self.bos_token and text.startswith(self.bos_token) and len(ids) >= 2 and ids[0] == ids[1] == bos:
            ids = ids[1:]
        return ids


class _TemplateRefusal(Exception):
    """`raise_exception(message)` called by a template."""


def _raise(message: str) -> None:
    raise _TemplateRefusal(message)


def _compile(source: str) -> Any:
    needed_for = "the model's chat template (tokenizer_config.json)"
    loopcontrols = require("jinja2.ext", "serve", needed_for).loopcontrols
    sandbox = require("jinja2.sandbox", "serve", needed_for)
    env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False, separators=None, sort_keys=False: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii, separators=separators, sort_keys=sort_keys
    )
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(source)


def _token_text(value: Any) -> str:
    """A special token as tokenizer_config.json writes it: "<s>" or {"content": "<s>", ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""
