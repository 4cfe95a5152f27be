"""`python -m pax_eqx.serve --job-log-dir DIR [--host 127.0.0.1 --port 8000 --slots 8 --chunk 64
--max-waiting 256 --timeout-s 600]`: serve the newest checkpoint of a job dir over HTTP, with the
OpenAI API (docs/serve.md).

The model decides what is served: a language model answers /v1/completions and
/v1/chat/completions with continuous batching (`--slots` requests decoded at once, prompts read
`--chunk` tokens a step, `--max-waiting` more queued before HTTP 429); an encoder-decoder answers
/v1/completions a request at a time; a classifier answers /v1/classify. Every server has `GET /`
(a page to try it), /health, /metrics and /v1/models.

The programs are compiled before the server listens, then one line says where it is:

    Serving shakespeare (language model, 8 slots) at http://127.0.0.1:8000 -- GET / for a page

SIGTERM (or Ctrl-C) drains: new requests get 503 and /health turns 503, the requests in flight
finish and are answered, then the process exits 0; a second signal stops at once.
`--port 0` takes a free port (the line says which).
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pax_eqx import programs
from pax_eqx.command_line import cli, entry
from pax_eqx.config import ConfigError
from pax_eqx.extras import require

DESCRIPTION = (
    "Serve the newest checkpoint of a job dir over HTTP with the OpenAI API: POST /v1/completions and "
    "/v1/chat/completions (a language model; an encoder-decoder completions only), POST /v1/classify (a "
    "classifier), GET / (a page to try it), /health, /metrics, /v1/models. SIGTERM drains the requests in "
    "flight and exits 0. docs/serve.md."
)
FLAGS: tuple[tuple[str, dict], ...] = (
    ("--host", dict(default="127.0.0.1", metavar="ADDRESS", help="the address to listen on (0.0.0.0: every one)")),
    ("--port", dict(type=int, default=8000, metavar="N", help="the port to listen on (0: a free one)")),
    ("--slots", dict(type=int, default=8, metavar="N", help="requests a language model decodes at once")),
    ("--chunk", dict(type=int, default=64, metavar="N", help="prompt tokens read per step for a request")),
    ("--max-waiting", dict(type=int, default=256, metavar="N", help="requests queued beyond the slots (then 429)")),
    (
        "--timeout-s",
        dict(type=float, default=600.0, metavar="S", help="the longest a request may take, queue included"),
    ),
    ("--served-model-name", dict(default=None, metavar="NAME", help="the model's name in the API (default: DIR's)")),
    ("--drain-timeout-s", dict(type=float, default=600.0, metavar="S", help="on SIGTERM, the longest to wait")),
)


def main(argv: Sequence[str] | None = None) -> int:
    exp, job_dir, ns = cli.parse(
        argv, "python -m pax_eqx.serve", DESCRIPTION, saved_experiment=True, sections=("checkpoint", "mesh"),
        extra=FLAGS,
    )  # fmt: skip
    _check_flags(ns)
    for module in ("uvicorn", "starlette"):  # before the restore: a missing extra is said in a second
        require(module, "serve", "python -m pax_eqx.serve")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sock = _listen(ns.host, ns.port)  # before the restore: a port in use fails in a second, not a minute
    from pax_eqx.programs.restore import restore_for_inference

    rt, state, step = restore_for_inference(exp, job_dir, "serve from")
    model = rt.programs.task.model(rt.programs.task.inference_params(state))
    backend, kind = _backend(exp, model, rt.tokenizer, ns, state.nt_state, rt.programs.task.dtype)
    _warm_up(backend)
    name = ns.served_model_name or Path(job_dir).resolve().name
    return _serve(backend, name, sock, ns, f"{name} ({kind}, checkpoint at step {step})")


def _check_flags(ns: Any) -> None:
    for flag, value, low in (("--slots", ns.slots, 1), ("--chunk", ns.chunk, 1), ("--max-waiting", ns.max_waiting, 0),
                             ("--port", ns.port, 0)):  # fmt: skip
        if value < low:
            raise ConfigError(f"{flag}={value}; give {low} or more.")
    if ns.port > 65535:
        raise ConfigError(f"--port={ns.port}; give a port from 0 (a free one) to 65535.")
    for flag, value in (("--timeout-s", ns.timeout_s), ("--drain-timeout-s", ns.drain_timeout_s)):
        if not value > 0:
            raise ConfigError(f"{flag}={value}; give a positive number of seconds.")


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); ConfigError naming the flag when it cannot be had."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        hint = "; pick another --port (0: a free one)" if port else ""
        raise ConfigError(f"cannot listen on --host {host} --port {port}: {e.strerror or e}{hint}.") from None
    sock.set_inheritable(True)
    return sock


def _backend(exp: Any, model: Any, tokenizer: Any, ns: Any, nt_state: Any, dtype: Any) -> tuple[Any, str]:
    """The backend the model's hooks call for, and its description. nt_state, dtype: the
    non-trainable state and the activation dtype a classifier's eval step uses."""
    from pax_eqx.serving.backends import LanguageModelBackend
    from pax_eqx.serving.classifier_backend import ClassifierBackend
    from pax_eqx.serving.seq2seq_backend import Seq2SeqBackend

    cfg = exp.model
    if cfg.fills_prompts:
        raise ConfigError(
            f"model {type(cfg).__name__} is a masked LM (it fills a prompt's masks, it does not continue it): serve "
            "serves language models, encoder-decoders and classifiers; fill masks with python -m pax_eqx.decode."
        )
    if cfg.decodes_inputs:
        return Seq2SeqBackend(
            model, tokenizer, vocab_size=cfg.vocab_size, max_waiting=ns.max_waiting
        ), "encoder-decoder"
    if cfg.decodes_examples:
        backend = ClassifierBackend(
            model, tuple(cfg.input_shape), state=nt_state, dtype=dtype, max_waiting=ns.max_waiting
        )
        return backend, "classifier"
    if cfg.decodes:
        backend = LanguageModelBackend(model, tokenizer, slots=ns.slots, chunk=ns.chunk, max_waiting=ns.max_waiting)
        return backend, f"language model, {ns.slots} slots"
    raise ConfigError(f"model {type(cfg).__name__} neither decodes nor classifies: there is nothing to serve.")


def _warm_up(backend: Any) -> None:
    """Compiles the backend's programs with one request, before the server listens."""
    from pax_eqx.serving.requests import Request

    if "classify" in backend.endpoints:
        import numpy as np

        backend.classify({"input": np.zeros(backend.input_shape).tolist()})
        return
    backend.submit(Request((backend.tokenizer.eos_id,), max_tokens=2, temperature=0.0))
    while backend.busy():
        backend.step()


def _serve(backend: Any, name: str, sock: socket.socket, ns: Any, what: str) -> int:
    uvicorn = require("uvicorn", "serve", "python -m pax_eqx.serve")
    from pax_eqx.serving.http_app import make_app

    app = make_app(backend, name, timeout_s=ns.timeout_s)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=30)
    server = _draining_server(uvicorn, config, app, backend, ns.drain_timeout_s)
    server.ready_line = f"Serving {what} at http://{shown}:{port} -- GET / for a page, docs/serve.md for the API."
    backend.start()
    server.run(sockets=[sock])
    if server.drain_error is not None:
        raise server.drain_error
    return 0


def _draining_server(uvicorn: Any, config: Any, app: Any, backend: Any, drain_timeout_s: float) -> Any:
    """uvicorn's server, printing `ready_line` once it listens, and draining on SIGTERM/SIGINT
    (the module docstring) instead of uvicorn's own exit, which re-raises the signal (the
    process would end by it, not with 0)."""

    class DrainingServer(uvicorn.Server):
        ready_line = ""
        drain_error: BaseException | None = None
        draining = False

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                print(self.ready_line, flush=True)

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.draining:  # a second signal: stop now
                self.should_exit = self.force_exit = True
                return
            self.draining = True
            app.state.draining = True
            print("Draining: new requests get 503; finishing the requests in flight.", file=sys.stderr, flush=True)
            threading.Thread(target=self._drain, name="pax_eqx-drain", daemon=True).start()

        def _drain(self) -> None:
            try:
                deadline = time.monotonic() + drain_timeout_s
                backend.stop(drain=True, timeout_s=drain_timeout_s)
                while app.state.traffic.in_flight and time.monotonic() < deadline:
                    time.sleep(0.05)
            except BaseException as e:  # noqa: BLE001 -- raised again by _serve, on the main thread
                self.drain_error = e
            finally:
                self.should_exit = True

    return DrainingServer(config)


if __name__ == "__main__":
    entry.run(main, memory_planner=programs.planned_bytes)
