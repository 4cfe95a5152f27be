"""`jax.export` artifacts of the two serving programs: prefill and generate without pax_eqx.

The server runs exactly two compiled programs (`SlotPrograms.prefill`, `SlotPrograms.generate`);
these are them, lowered to serialized StableHLO, so that a process with only `jax` and `numpy`
(`run_exported.py`, another framework's runtime, a C++ PJRT client) runs the same math:

    OUT/prefill.stablehlo    Exported.serialize() of prefill  (jax.export.deserialize reads it)
    OUT/generate.stablehlo   Exported.serialize() of generate
    OUT/weights.npz          the model's arrays, one entry per name (manifest "weights", in call order)
    OUT/state.npz            an empty SlotState: the zero KV cache, key_valid, length (manifest "state")
    OUT/manifest.json        sizes (slots, chunk, cache_len, max_seq_len, vocab_size, eos_id), every
                             input and output of both programs in call order, platforms, the model
    OUT/run_exported.py      a 30-line greedy loader using jax and numpy only (copied from this folder)

Why flat arrays: an Exported's inputs and outputs are pytrees, and deserializing a pytree of
Equinox modules needs their classes registered (pax_eqx importable). So both programs take and
give flat lists of arrays, in the order manifest.json lists them:

    prefill(*weights, *state, slot, chunk, n_valid, start, temperature, top_k, top_p, seed, count)
        -> (*state, token)                 sampling settings [1]: the one request's row
    generate(*weights, *state, tokens, active, temperature, top_k, top_p, seed, count)
        -> (*state, tokens)                sampling settings [slots]: a row per slot

The state a program returns is the state to pass to the next call. Nothing is donated: a loader
would have to know which inputs it may no longer read, and the cache is the one large input (the
server's own programs donate it; an exported one holds it twice during a call).

numpy cannot store bfloat16 or the float8 types in an .npz, so such an array is stored as
unsigned integers of the same width and the manifest gives its dtype: a loader reads every array
as `npz[name].view(jax.numpy.dtype(dtype))` (a no-op for numpy's own dtypes).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import jax
import numpy as np

from pax_eqx.config import ConfigError
from pax_eqx.data.tokenizers import ByteTokenizer
from pax_eqx.extras import require
from pax_eqx.learners.variables import path_name
from pax_eqx.serving.row_sampling import RowSampling
from pax_eqx.serving.slot_programs import SlotPrograms

# jax.export writes (Exported.serialize) and reads its artifacts with flatbuffers, which jax does
# not install; checked here, when the export command imports this module, before any work.
require("flatbuffers", "export", "python -m pax_eqx.export")

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")  # what jax.export lowers for
PROGRAMS = ("prefill", "generate")
FORMAT = "pax_eqx.export/1"
LOADER = Path(__file__).with_name("run_exported.py")
_SAMPLING = tuple(f.name for f in dataclasses.fields(RowSampling))  # temperature, top_k, top_p, seed, count
_LM_METHODS = ("init_cache", "extend_step", "max_seq_len", "vocab_size")  # what SlotPrograms calls
_STACK_METHODS = ("select_cache", "write_cache_rows")


@dataclasses.dataclass
class ExportedSlotPrograms:
    """Both programs exported, with what a loader passes them.

    exported: {"prefill": Exported, "generate": Exported}; weights / state: {name: numpy array} in
    call order (the model's arrays; an empty SlotState's leaves); manifest: manifest.json's dict."""

    exported: dict[str, jax.export.Exported]
    weights: dict[str, np.ndarray]
    state: dict[str, np.ndarray]
    manifest: dict[str, Any]

    def write(self, out: Path, *, overwrite: bool = False) -> list[str]:
        """Writes the artifacts (the module docstring's list) into `out`, which must be new or
        empty unless `overwrite`. Everything is written into a temporary directory beside `out`
        and renamed onto it at the end, so a failure leaves no half-written `out`. Returns the
        file names."""
        out = Path(out)
        check_out_dir(out, overwrite)
        out.absolute().parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.absolute().parent))
        try:
            for program, exported in self.exported.items():
                (tmp / f"{program}.stablehlo").write_bytes(exported.serialize())
            np.savez(tmp / "weights.npz", **{name: _storable(a) for name, a in self.weights.items()})
            np.savez_compressed(tmp / "state.npz", **{name: _storable(a) for name, a in self.state.items()})
            (tmp / "manifest.json").write_text(_manifest_json(self.manifest))
            shutil.copyfile(LOADER, tmp / LOADER.name)
            _replace_dir(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return sorted(p.name for p in out.iterdir())


def export_slot_programs(
    model: Any, *, slots: int = 4, chunk: int = 64, platforms: tuple[str, ...] = ("cpu",), eos_id: int = -1,
    tokenizer: Any = None, name: str = "", step: int | None = None,
) -> ExportedSlotPrograms:  # fmt: skip
    """`jax.export` of `SlotPrograms(model, slots, chunk)`'s prefill and generate, for `platforms`.

    model: a language model (its inference parameters: the arrays become `weights`); chunk is
    capped at max_seq_len as the Engine caps it. eos_id: where a loader stops (-1: never; the
    job's tokenizer's eos_id from the CLI). tokenizer: described in the manifest when a loader
    can apply it without a library (bytes), else the loader works on token ids. name / step:
    recorded in the manifest (the experiment, the checkpoint step)."""
    check_language_model(model)
    platforms = check_platforms(platforms)
    check_sizes(slots, chunk)
    programs = SlotPrograms(model, slots=slots, chunk=min(chunk, model.max_seq_len))
    weight_names, weights, weights_def = _named_leaves(programs.params)
    state_names, state, state_def = _named_leaves(programs.empty())
    n_weights, n_state = len(weights), len(state)
    i32 = np.dtype(np.int32)

    def sampling_specs(rows: int) -> list[tuple[str, tuple[int, ...], np.dtype]]:
        zeros = RowSampling.zeros(rows)
        return [(f, (rows,), np.dtype(getattr(zeros, f).dtype)) for f in _SAMPLING]

    call_inputs = {
        "prefill": [("slot", (), i32), ("chunk", (programs.chunk,), i32), ("n_valid", (), i32), ("start", (), i32),
                    *sampling_specs(1)],
        "generate": [("tokens", (slots,), i32), ("active", (slots,), np.dtype(bool)), *sampling_specs(slots)],
    }  # fmt: skip
    results = {"prefill": ("token", (), i32), "generate": ("tokens", (slots,), i32)}

    def flat(program: str):
        run = getattr(programs, program)  # the jitted program the server runs (its donation is moot inside)

        def flat_program(*arrays: jax.Array) -> tuple[jax.Array, ...]:
            params = jax.tree.unflatten(weights_def, arrays[:n_weights])
            slot_state = jax.tree.unflatten(state_def, arrays[n_weights : n_weights + n_state])
            per_call = arrays[n_weights + n_state :]
            head, sampling = per_call[: -len(_SAMPLING)], RowSampling(*per_call[-len(_SAMPLING) :])
            new_state, result = run(params, slot_state, *head, sampling)
            return (*jax.tree.leaves(new_state), result)

        return flat_program

    def spec(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype)

    exported, manifest_programs = {}, {}
    for program in PROGRAMS:
        specs = [spec(a.shape, a.dtype) for a in (*weights, *state)] + [spec(s, d) for _, s, d in call_inputs[program]]
        exported[program] = jax.export.export(jax.jit(flat(program)), platforms=platforms)(*specs)
        inputs = (
            [_entry(n, a.shape, a.dtype, source="weights.npz") for n, a in zip(weight_names, weights, strict=True)]
            + [_entry(n, a.shape, a.dtype, source="state.npz") for n, a in zip(state_names, state, strict=True)]
            + [_entry(n, s, d, source="call") for n, s, d in call_inputs[program]]
        )
        result_name, result_shape, result_dtype = results[program]
        outputs = [_entry(n, a.shape, a.dtype, to="state") for n, a in zip(state_names, state, strict=True)]
        outputs.append(_entry(result_name, result_shape, result_dtype, to="result"))
        _check_matches(program, exported[program], inputs, outputs)
        manifest_programs[program] = {"file": f"{program}.stablehlo", "inputs": inputs, "outputs": outputs}
    manifest = {
        "format": FORMAT,
        "model": name,
        "step": step,
        "platforms": list(platforms),
        "slots": slots,
        "chunk": programs.chunk,
        "cache_len": programs.cache_len,
        "max_seq_len": int(model.max_seq_len),
        "vocab_size": int(model.vocab_size),
        "eos_id": int(eos_id),
        "tokenizer": describe_tokenizer(tokenizer),
        "weights": [_entry(n, a.shape, a.dtype) for n, a in zip(weight_names, weights, strict=True)],
        "state": [_entry(n, a.shape, a.dtype) for n, a in zip(state_names, state, strict=True)],
        **manifest_programs,
        "jax_version": jax.__version__,
        "calling_convention_version": exported["prefill"].calling_convention_version,
    }
    return ExportedSlotPrograms(
        exported=exported,
        weights={n: np.asarray(jax.device_get(a)) for n, a in zip(weight_names, weights, strict=True)},
        state={n: np.asarray(jax.device_get(a)) for n, a in zip(state_names, state, strict=True)},
        manifest=manifest,
    )


def check_language_model(model: Any) -> None:
    """ConfigError unless `model` continues token sequences with a KV cache (what the serving
    programs call: init_cache, extend_step, its stack's select_cache / write_cache_rows)."""
    stack = getattr(model, "stack", None)
    missing = [m for m in _LM_METHODS if not hasattr(model, m)]
    missing += [f"stack.{m}" for m in _STACK_METHODS if not hasattr(stack, m)]
    if missing:
        raise ConfigError(
            f"the model ({type(model).__name__}) is not a language model that continues a prompt (it has no "
            f"{', '.join(missing)}); export writes a language model's prefill and generate programs: export a job "
            "dir that trained one (e.g. --exp shakespeare_char)."
        )


def check_platforms(platforms: Any) -> tuple[str, ...]:
    """The platforms as a tuple, without repeats; ConfigError naming an unknown one."""
    platforms = tuple(dict.fromkeys(platforms))
    if not platforms:
        raise ConfigError(f"--platforms is empty; name one or more of {', '.join(PLATFORMS)} (e.g. --platforms cpu).")
    for p in platforms:
        if p not in PLATFORMS:
            hint = " (an NVIDIA GPU is cuda, an AMD one rocm)" if p in ("gpu", "nvidia", "amd") else ""
            raise ConfigError(
                f"--platforms {p!r} is not a platform jax.export lowers for{hint}; use one or more of "
                f"{', '.join(PLATFORMS)}, e.g. --platforms cpu cuda."
            )
    return platforms


def check_sizes(slots: int, chunk: int) -> None:
    """ConfigError naming --slots or --chunk when it is below 1."""
    for flag, value in (("--slots", slots), ("--chunk", chunk)):
        if value < 1:
            raise ConfigError(f"{flag} {value}: it must be at least 1 (the defaults are --slots 4 --chunk 64).")


def check_out_dir(out: Path, overwrite: bool) -> None:
    """ConfigError when `out` is a file, or a non-empty directory and not `overwrite`."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file, not a directory; choose a new directory.")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConfigError(
            f"--out {str(out)!r} is not empty; choose a new directory, or pass --overwrite to replace what is there."
        )


def describe_tokenizer(tokenizer: Any) -> dict[str, Any] | None:
    """The tokenizer in words a loader can apply without a library: bytes (id = UTF-8 byte +
    offset; pad/unk/bos/eos below it), else None (a SentencePiece or tokenizer.json vocabulary
    needs its library: the loader takes and prints token ids)."""
    if isinstance(tokenizer, ByteTokenizer):
        return {
            "kind": "byte",
            "offset": tokenizer.vocab_size - 256,
            "meaning": "id = UTF-8 byte + offset; ids below offset are pad, unk, bos, eos",
            "pad_id": tokenizer.pad_id,
            "bos_id": tokenizer.bos_id,
            "eos_id": tokenizer.eos_id,
        }
    return None


def _named_leaves(tree: Any) -> tuple[list[str], list[Any], Any]:
    """(names, arrays, treedef) of the array leaves of `tree`, in pytree order (None leaves of a
    partitioned model are dropped by the flattening)."""
    pairs, treedef = jax.tree_util.tree_flatten_with_path(tree)
    names = [path_name(path) or "array" for path, _ in pairs]
    if len(set(names)) != len(names):
        raise ValueError(f"two arrays share a name in {names}; the manifest needs them distinct.")
    return names, [leaf for _, leaf in pairs], treedef


def _entry(name: str, shape: Any, dtype: Any, **more: str) -> dict[str, Any]:
    return {"name": name, "shape": [int(d) for d in shape], "dtype": np.dtype(dtype).name, **more}


def _check_matches(program: str, exported: jax.export.Exported, inputs: list, outputs: list) -> None:
    """The manifest's inputs and outputs are the Exported's (a bug otherwise, not a user error)."""
    got = [(list(a.shape), np.dtype(a.dtype).name) for a in exported.in_avals]
    got_out = [(list(a.shape), np.dtype(a.dtype).name) for a in exported.out_avals]
    if got != [(e["shape"], e["dtype"]) for e in inputs] or got_out != [(e["shape"], e["dtype"]) for e in outputs]:
        raise AssertionError(f"{program}: the manifest's inputs/outputs are not the exported program's.")


def _manifest_json(manifest: dict[str, Any]) -> str:
    """The manifest indented, with each input, output, weight and state entry on one line (a
    large model has hundreds of them)."""
    entries: dict[str, str] = {}

    def mark(value: Any) -> Any:
        if isinstance(value, dict) and "shape" in value:
            entries[key := f"@entry{len(entries)}@"] = json.dumps(value)
            return key
        if isinstance(value, dict):
            return {k: mark(v) for k, v in value.items()}
        return [mark(v) for v in value] if isinstance(value, list) else value

    text = json.dumps(mark(manifest), indent=1)
    for key, entry in entries.items():
        text = text.replace(json.dumps(key), entry)
    return text + "\n"


def _storable(array: np.ndarray) -> np.ndarray:
    """`array` as numpy can save it: a dtype numpy does not know (bfloat16, float8) as unsigned
    integers of its width (the manifest keeps the dtype; `.view` restores it)."""
    if array.dtype.kind in "biufc":
        return array
    return array.view(np.dtype(f"u{array.dtype.itemsize}"))


def _replace_dir(tmp: Path, out: Path) -> None:
    """Renames `tmp` onto `out`: an empty or missing `out` is replaced at once; a full one (with
    --overwrite) is moved aside first and deleted after."""
    if out.is_dir() and any(out.iterdir()):
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.absolute().parent))
        os.replace(out, old / out.name)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)
