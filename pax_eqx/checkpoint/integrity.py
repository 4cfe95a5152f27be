"""What a checkpoint promises about its arrays: finite values, known shapes, and a checksum.

A checkpoint is written beside a small JSON *manifest*: for every leaf of the train state, its
path (`params/blocks/attn/w`), shape, dtype and a 32-bit checksum. The manifest is what lets a
restore
- name the leaf whose shape or dtype differs from the model being restored (orbax itself only
  says "Requested shape (4, 8) is not compatible with the stored shape (8, 8)", without the
  leaf), and
- notice a committed checkpoint whose bytes were damaged after the commit. Truncated files make
  tensorstore fail loudly, but bytes overwritten in place (or an inlined small array in a
  rewritten index) can decode to wrong numbers without any error; the checksum turns that into
  an error, so the restore falls back to an older checkpoint instead of silently training on
  garbage.

The checksum is the wrapping uint32 sum of the array's raw words. Integer addition modulo 2**32
is exact and order-free, so the sum is the same whatever the sharding or device count it is
computed on -- which is what a restore onto a different mesh needs -- and it is computed on the
devices, by one jitted reduction per leaf, on global arrays (every host gets the same numbers).
It catches random damage with probability 1 - 2**-32, not a deliberate forgery: it is a
corruption check, not a signature.

The manifest also covers everything else a restore reads, and says which step it belongs to:
- `data_sha256`: the SHA-256 of each host's data iterator state file (`data/process_<i>-of-<n>.json`),
  one per process, so a damaged input position is noticed instead of resuming at a wrong batch;
- `step` (the step directory's name at save time) and `state_step` (the train state's own `step`
  field, when it has one), so a step directory renamed or copied over another, or a manifest
  paired with another step's arrays, is caught;
- `sha256`: the manifest's own digest (of its canonical JSON without this key), so a manifest
  whose numbers were damaged is not trusted.
A restore treats any disagreement as a damaged checkpoint (it falls back to the next newest).
Manifests written before these fields existed lack them, and are checked for what they hold.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

MANIFEST_FORMAT = "pax_eqx.checkpoint/1"


def leaf_path(path: tuple[Any, ...]) -> str:
    """`jax.tree_util` key path -> "params/blocks/attn/w" (the name errors and manifests use)."""
    return jax.tree_util.keystr(path, simple=True, separator="/") or "<root>"


def _is_array(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic))


def _is_float(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


def _words(x: jax.Array) -> jax.Array:
    """The array's raw bits as uint32 words (one word per element for <= 32-bit dtypes)."""
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        x = jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    bits = x.dtype.itemsize * 8
    if bits >= 32:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    return jax.lax.bitcast_convert_type(x, jnp.dtype(f"uint{bits}")).astype(jnp.uint32)


def _device_summary(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    finite = jnp.all(jnp.isfinite(x)) if _is_float(x.dtype) else jnp.bool_(True)
    return jnp.sum(_words(x), dtype=jnp.uint32), finite


# One program for all the leaves that live on the same devices: one dispatch, one compile.
_device_summaries = jax.jit(lambda leaves: [_device_summary(x) for x in leaves])


def _host_summary(x: np.ndarray) -> tuple[int, bool]:
    """The same checksum as `_device_summary`, for numpy leaves (exact: uint64 accumulator)."""
    x = np.ascontiguousarray(x)
    finite = bool(np.all(np.isfinite(x))) if _is_float(x.dtype) else True
    if x.dtype == np.bool_:
        words = x.astype(np.uint64)
    elif jnp.issubdtype(x.dtype, np.complexfloating):
        words = np.stack([x.real, x.imag], axis=-1).view(f"uint{x.real.dtype.itemsize * 8}")
    else:
        words = x.view(f"uint{x.dtype.itemsize * 8}") if x.dtype.itemsize <= 4 else x.view(np.uint32)
    return int(np.sum(words, dtype=np.uint64) % (1 << 32)), finite


def _to_host(x: jax.Array) -> np.ndarray:
    # Reductions of global arrays come back replicated: every host holds the whole scalar.
    return np.asarray(x.addressable_data(0))


def _array_summaries(arrays: list[Any]) -> list[tuple[int, bool]]:
    results: list[tuple[int, bool] | None] = [None] * len(arrays)
    groups: dict[Any, list[int]] = {}
    for i, x in enumerate(arrays):
        if isinstance(x, jax.Array):
            groups.setdefault(frozenset(x.sharding.device_set), []).append(i)
        else:
            results[i] = _host_summary(x)
    for indices in groups.values():
        sums = _device_summaries([arrays[i] for i in indices])
        for i, (checksum, finite) in zip(indices, sums):
            results[i] = (int(_to_host(checksum)), bool(_to_host(finite)))
    return results


def leaf_summaries(tree: Any) -> list[dict[str, Any]]:
    """One entry per leaf, in flattening order: path, shape, dtype, checksum, finite.

    Array leaves are summarised where they live (jax arrays on their devices, numpy on the
    host); other leaves (Python numbers) are recorded by value. Every host must call this
    together on global arrays (it runs a jitted computation over them), as it does for `save`.
    """
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    summaries = iter(_array_summaries([x for _, x in flat if _is_array(x)]))
    entries = []
    for path, leaf in flat:
        if _is_array(leaf):
            checksum, finite = next(summaries)
            entries.append(
                {
                    "path": leaf_path(path),
                    "shape": [int(d) for d in np.shape(leaf)],
                    "dtype": str(leaf.dtype),
                    "checksum": checksum,
                    "finite": finite,
                }
            )
        else:
            finite = not isinstance(leaf, float) or math.isfinite(leaf)
            entries.append({"path": leaf_path(path), "value": repr(leaf), "finite": finite})
    return entries


def all_finite(tree: Any) -> bool:
    """True when no floating-point leaf of `tree` holds a NaN or an Inf (integer leaves pass)."""
    return all(entry["finite"] for entry in leaf_summaries(tree))


def nonfinite_paths(entries: list[dict[str, Any]]) -> list[str]:
    return [e["path"] for e in entries if not e["finite"]]


def build_manifest(
    step: int,
    entries: list[dict[str, Any]],
    has_data: bool,
    *,
    state_step: int | None = None,
    data_sha256: list[str] | None = None,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The manifest of `step` (see module doc), sealed with its own digest. config: the
    experiment that wrote it (JSON), so a job dir whose config.json was lost still knows it."""
    leaves = [{k: v for k, v in e.items() if k != "finite"} for e in entries]
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "step": step,
        "process_count": jax.process_count(),
        "has_data": has_data,
        "leaves": leaves,
    }
    if state_step is not None:
        manifest["state_step"] = state_step
    if data_sha256 is not None:
        manifest["data_sha256"] = data_sha256
    if config is not None:
        manifest["config"] = config
    manifest["sha256"] = manifest_digest(manifest)
    return manifest


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_digest(manifest: dict[str, Any]) -> str:
    """SHA-256 of the manifest's canonical JSON, its own `sha256` key left out."""
    body = {k: v for k, v in manifest.items() if k != "sha256"}
    return sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def state_step(tree: Any) -> int | None:
    """The integer scalar `tree.step` (a TrainState's step counter), or None if there is none."""
    value = getattr(tree, "step", None)
    if isinstance(value, jax.Array):
        if value.shape != () or not jnp.issubdtype(value.dtype, jnp.integer):
            return None
        return int(_to_host(value))
    if isinstance(value, (np.ndarray, np.generic)) and value.shape == () and np.issubdtype(value.dtype, np.integer):
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def manifest_problems(manifest: Any, step: int) -> list[str]:
    """Why the manifest read from step directory `step` cannot be trusted (empty: it can)."""
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return [f"its manifest is not a {MANIFEST_FORMAT} manifest"]
    problems = []
    if "sha256" in manifest and manifest["sha256"] != manifest_digest(manifest):
        problems.append("its manifest does not match its own checksum (the manifest file is damaged)")
    if manifest.get("step") != step:
        problems.append(
            f"its directory is step {step} but its manifest was written for step {manifest.get('step')!r} (a step "
            "directory renamed or copied over another)"
        )
    for key in ("leaves", "has_data", "process_count"):
        if key not in manifest:
            problems.append(f"its manifest has no {key!r}")
    return problems


def restored_problems(manifest: dict[str, Any], restored_state: Any, data_bytes: bytes | None) -> list[str]:
    """Disagreements between the manifest and what was restored: the state's step, the arrays'
    checksums and this host's data iterator state file."""
    problems = []
    expected_step = manifest.get("state_step")
    if expected_step is not None:
        got = state_step(restored_state)
        if got != expected_step:
            problems.append(f"the restored state's step is {got}, its manifest says {expected_step}")
    damaged = checksum_mismatches(manifest, restored_state)
    if damaged:
        problems.append(f"{len(damaged)} restored arrays differ from the checksums written at save time: {damaged[:5]}")
    digests = manifest.get("data_sha256")
    if data_bytes is not None and digests is not None:
        index = jax.process_index()
        if index >= len(digests) or digests[index] != sha256(data_bytes):
            problems.append(
                f"the data iterator state of process {index} differs from the checksum written at save time"
            )
    return problems


def structure_mismatches(manifest: dict[str, Any], abstract: Any) -> list[str]:
    """Human-readable differences between a saved manifest and the state being restored into.

    Empty when every leaf of `abstract` (jax.ShapeDtypeStruct or arrays) is in the checkpoint
    with the same shape and dtype and the checkpoint holds no other leaf.
    """
    saved = {leaf["path"]: leaf for leaf in manifest["leaves"]}
    flat, _ = jax.tree_util.tree_flatten_with_path(abstract)
    wanted = {leaf_path(path): leaf for path, leaf in flat}
    problems = []
    for path, leaf in wanted.items():
        if path not in saved:
            problems.append(f"{path}: in the model but not in the checkpoint")
            continue
        entry = saved[path]
        if "shape" not in entry:
            continue
        shape, dtype = tuple(getattr(leaf, "shape", ())), str(getattr(leaf, "dtype", type(leaf).__name__))
        saved_shape = tuple(entry["shape"])
        if shape != saved_shape:
            problems.append(f"{path}: checkpoint has shape {saved_shape}, the model expects {shape}")
        elif dtype != entry["dtype"]:
            problems.append(f"{path}: checkpoint has dtype {entry['dtype']}, the model expects {dtype}")
    for path in saved:
        if path not in wanted:
            problems.append(f"{path}: in the checkpoint but not in the model")
    return problems


def checksum_mismatches(manifest: dict[str, Any], restored: Any) -> list[str]:
    """Leaves whose restored bytes do not add up to the checksum written at save time."""
    saved = {leaf["path"]: leaf for leaf in manifest["leaves"]}
    bad = []
    for entry in leaf_summaries(restored):
        expected = saved.get(entry["path"], {}).get("checksum")
        if expected is not None and entry.get("checksum") != expected:
            bad.append(entry["path"])
    return bad
