"""Write ImageNet's folder layout as ArrayRecord shards of the encoded files, for
`--data.source imagenet_array_record` (imagenet_source.py).

    python -m pax_eqx.prepare_images --input /data/imagenet --output /data/imagenet_ar \
        [--num-shards 1024] [--val-num-shards 64]

For each split folder of --input (`train/<wnid>/*.JPEG`, `val/<wnid>/*.JPEG`), writes
`<output>/<split>/shard-KKKKK-of-NNNNN.array_record` and `<output>/<split>/images.json`. A
record is the label (int32, little-endian; the class's position among the train folder's sorted
class names) followed by the file's bytes, unchanged: nothing is decoded or resized, so the
crops are still taken from the original pixels when training reads them. Files are taken in
(class, name) order and cut into contiguous shards of near-equal counts, so the same folder
gives the same shards; each shard is written under a temporary name and renamed, and the
manifest is written last (a directory with images.json is complete). Each file's header is
opened with Pillow first, so a file that is no image is named here, not in a training worker.
Each shard's size and fingerprint (prepare/integrity.py) go into images.json, and the reader
(imagenet_source.read_images_manifest) checks them whenever it opens the directory: a shard cut
short or replaced is refused at start, naming it.

The output root is created (and checked to be writable) before anything is read; a path under
a file, or a directory this user cannot write, is one error, and a refused run removes the
directories it created.

One process, limited by the disk: ImageNet's 1.28 M training files (~140 GB) are one pass of
reading and writing them.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from pax_eqx.config import ConfigError
from pax_eqx.data.imagenet_source import FORMAT, MANIFEST, SPLIT_FOLDERS, encode_record
from pax_eqx.data.prepare import integrity


def _check_image(path: Path) -> None:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path):
            pass
    except (OSError, UnidentifiedImageError) as e:
        raise ConfigError(f"--input: {str(path)!r} is not a readable image ({e}); remove or replace it.") from None


def write_split(files: list[Path], labels: list[int], classes: list[str], directory: Path, num_shards: int) -> dict:
    """`files` (with their `labels`) as `num_shards` ArrayRecord shards plus images.json in
    `directory`; returns the manifest. Shard k holds files [k N / S, (k + 1) N / S)."""
    from array_record.python.array_record_module import ArrayRecordWriter

    if not files:
        raise ConfigError(f"--input: no image files for {directory.name}/.")
    num_shards = max(1, min(num_shards, len(files)))
    directory.mkdir(parents=True, exist_ok=True)
    shards = []
    for k in range(num_shards):
        lo, hi = k * len(files) // num_shards, (k + 1) * len(files) // num_shards
        name = f"shard-{k:05d}-of-{num_shards:05d}.array_record"
        tmp = directory / f".{name}.tmp"
        writer = ArrayRecordWriter(str(tmp), "group_size:1")
        try:
            for path, label in zip(files[lo:hi], labels[lo:hi]):
                _check_image(path)
                writer.write(encode_record(label, path.read_bytes()))
        finally:
            writer.close()
            if sys.exc_info()[0] is not None:
                tmp.unlink(missing_ok=True)  # a refused run leaves no half-written shard
        size, fingerprint = tmp.stat().st_size, integrity.fingerprint_file(str(tmp))
        os.replace(tmp, directory / name)
        shards.append({"file": name, "records": hi - lo, "bytes": size, "fingerprint": fingerprint})
    manifest = {"format": FORMAT, "classes": classes, "num_records": len(files), "shards": shards}
    tmp = directory / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, directory / MANIFEST)
    return manifest


def write_image_records(input_root: str, output_root: str, num_shards: int = 1024, val_num_shards: int = 64) -> dict:
    """Both splits of the folder layout at `input_root` as ArrayRecord shards under
    `output_root` (module doc); returns {split folder: manifest}. val/ is optional."""
    from pax_eqx.data.imagenet_source import folder_source

    if num_shards < 1 or val_num_shards < 1:
        raise ConfigError(f"--num-shards {num_shards} / --val-num-shards {val_num_shards}: both must be >= 1.")
    created = _output_root(output_root)
    written = {}
    try:
        for split, shards in (("train", num_shards), ("eval", val_num_shards)):
            folder = SPLIT_FOLDERS[split]
            if split == "eval" and not os.path.isdir(os.path.join(input_root, folder)):
                continue
            source, classes = folder_source(input_root, split, "--input")
            files = [Path(source[i][2]) for i in range(len(source))]
            labels = [int(source[i][1]) for i in range(len(source))]
            written[folder] = write_split(files, labels, classes, Path(output_root) / folder, shards)
    except ConfigError:
        if created is not None:  # a refused run leaves no directory behind
            shutil.rmtree(created, ignore_errors=True)
        raise
    return written


def _output_root(output_root: str) -> Path | None:
    """Creates `output_root` (refusing a path under a file, or where this user cannot write) and
    returns the topmost directory this created (None if it existed)."""
    root = Path(output_root)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--output {output_root!r} is a file, not a directory; choose a directory.")
    for parent in root.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(
                    f"--output {output_root!r} cannot be created: {str(parent)!r} is a file, not a directory; "
                    "choose a path under a directory."
                )
            break
    missing = [p for p in (root, *root.parents) if not p.exists()]
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            f"--output {output_root!r} cannot be created ({e.strerror or e}); choose a directory this user can write."
        ) from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise ConfigError(
            f"--output {output_root!r} is not writable by this user (permission denied); fix its permissions, or "
            "choose another directory."
        )
    return missing[-1] if missing else None
