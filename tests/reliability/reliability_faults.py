"""A `data.custom_input` for fault injection: the text_files pipeline, plus faults chosen by env.

The reliability tests run every job with

    --data.source custom --data.custom-input reliability_faults.faulty_text_input

and the corpus's path in `PAX_RELIABILITY_CORPUS` (the custom source has no data.path: its
function is the whole source), so the uninterrupted reference run, the killed runs and their
reruns all have the same command line and the same data. With no `PAX_RELIABILITY_FAULTS` in the
environment this is the text_files input of that corpus, untouched. The variable names faults at
absolute batch numbers (batch n feeds training step n; the count is part of the checkpointed
iterator state, so it survives resumes):

    hold:train:5     before reading train batch 5, write MARKERS/hold-train-5 and wait until
                     MARKERS/release-train-5 exists: the run is parked at a known point (step 4
                     done, step 5 not begun) for the test to SIGKILL it or send it a signal
    raise:train:6    reading train batch 6 raises OSError (a failing disk or network read)
    nan:train:5      train batch 5 carries NaN weights, so step 5's loss and gradients are NaN

Several faults are separated by ";". `hold:eval:N` parks in the N-th eval batch read (counted
over the whole run, as the rolling eval input is).

`mismatched_tokenizer_input` is a second custom input, whose eval split comes with a tokenizer
of another vocabulary than training's (what the experiment must refuse).
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from pax_eqx.data import ByteTokenizer, Input, TextFilesSource, build_input

FAULTS_ENV = "PAX_RELIABILITY_FAULTS"
MARKERS_ENV = "PAX_RELIABILITY_MARKERS"
CORPUS_ENV = "PAX_RELIABILITY_CORPUS"
HOLD_LIMIT_S = 120.0


def _faults() -> set[tuple[str, str, int]]:
    spec = os.environ.get(FAULTS_ENV, "")
    out = set()
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        kind, split, number = part.split(":")
        out.add((kind, split, int(number)))
    return out


class FaultyInput(Input):
    """Delegates to the real input; counts batches served (in its state) and injects faults."""

    def __init__(self, inner: Input):
        self.__dict__.update(inner.__dict__)  # cfg, split, shard, tokenizer, ... for the callers
        self.inner = inner
        self.served = 0
        self.faults = _faults()

    def get_next(self) -> dict[str, np.ndarray]:
        number = self.served + 1
        if ("hold", self.split, number) in self.faults:
            _hold(f"{self.split}-{number}")
        if ("raise", self.split, number) in self.faults:
            raise OSError(errno.EIO, f"Input/output error (injected) reading {self.split} batch {number}")
        batch = self.inner.get_next()
        self.served = number
        if ("nan", self.split, number) in self.faults:
            batch = {**batch, "weights": np.full_like(batch["weights"], np.nan)}
        return batch

    def reset(self) -> None:
        self.inner.reset()

    def close(self) -> None:
        self.inner.close()

    def get_state(self) -> dict[str, Any]:
        return {"inner": self.inner.get_state(), "served": self.served}

    def set_state(self, state: dict[str, Any]) -> None:
        self.inner.set_state(state["inner"])
        self.served = state["served"]


def _hold(name: str) -> None:
    markers = Path(os.environ[MARKERS_ENV])
    (markers / f"hold-{name}").touch()
    deadline = time.monotonic() + HOLD_LIMIT_S
    while not (markers / f"release-{name}").exists() and time.monotonic() < deadline:
        time.sleep(0.005)


def text_files_input(data_cfg, split, tokenizer, shard) -> Input:
    """The text_files input of the corpus at $PAX_RELIABILITY_CORPUS, with the experiment's data
    settings (seq_len, batch sizes, seeds)."""
    if CORPUS_ENV not in os.environ:
        raise KeyError(f"{CORPUS_ENV} is not set: reliability_harness.environment() names the corpus there.")
    text_files = data_cfg.replace(source=TextFilesSource(path=os.environ[CORPUS_ENV]))
    return build_input(text_files, split, tokenizer, shard.count, shard.index)


def faulty_text_input(data_cfg, split, tokenizer, shard) -> Input:
    return FaultyInput(text_files_input(data_cfg, split, tokenizer, shard))


class _OtherBytes(ByteTokenizer):
    """A tokenizer with another vocabulary fingerprint (as a second SentencePiece model would have)."""

    fingerprint = "other-vocabulary"


def mismatched_tokenizer_input(data_cfg, split, tokenizer, shard) -> Input:
    """The text_files input, whose eval split is built with a different tokenizer than train's."""
    inner = text_files_input(data_cfg, split, tokenizer, shard)
    if split == "eval":
        inner.tokenizer = _OtherBytes()
    return inner
