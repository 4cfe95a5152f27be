"""ImageNet at the source: encoded JPEGs decoded in grain's workers, cropped as Pax crops them.

    --data.source imagenet_folder --data.path /data/imagenet           # JPEG files
    --data.source imagenet_array_record --data.path /data/imagenet_ar  # ArrayRecord of the same bytes

Storage (`data.path` is the root of both splits; the eval split is always `<root>/val`):

- `imagenet_folder`: ImageNet's usual layout, `<root>/train/<wnid>/*.JPEG` and
  `<root>/val/<wnid>/*.JPEG` (the validation images moved into their class folders, as
  PyTorch's ImageNet example and most mirrors have them; .jpg/.jpeg/.png, any case). Classes
  are the train folder's subfolders sorted by name: label ids 0..999 of the 1000 wnids, Pax's
  (TFDS's) ids. The files are listed once at start; no header is read and sizes may differ.
- `imagenet_array_record`: `<root>/train/` and `<root>/val/` each hold ArrayRecord shards of
  records `label (int32, little-endian) + the file's bytes, unchanged` and an `images.json`
  listing the classes and each shard's record count, written from the folder layout by
  `python -m pax_eqx.prepare_images --input /data/imagenet --output /data/imagenet_ar`
  (image_records.py). Fewer, larger files than 1.3 M JPEGs for a network file system.

Each example is decoded with Pillow when the batch is made -- in grain's worker processes
with `data.train.num_workers` > 0 -- then cropped (inception_crop.py):

- train: Inception's random-resized crop of the whole image, bicubic resize to the model's
  S x S (`data.image_shape` = (S, S, C)), and a left-right flip with probability 1/2 if
  `data.augment.horizontal_flip`;
- eval: the central crop, S / (S + 32) of the shorter side (TF's CROP_PADDING = 32: 87.5 % at
  S = 224), resized to S x S.

Pixels are then scaled to 0..1 and normalised with `data.augment.mean` / `std` like every image
source (augment.py); C = 1 decodes to grayscale, C = 3 to RGB. No offline resizing: crops are
taken from the original pixels.

Randomness: the crop and flip of an example are drawn from a generator seeded with
(`data.train.input_random_seed`, the example's index in the split, the epoch). The order is the
other sources' (host_sharding.py: a fresh shuffle each epoch, host i taking positions i::n of
it), and the epoch of the k-th example a host reads is k // (its examples per epoch). So the
view of an image does not depend on the host count or on which worker decodes it, it changes
every epoch, and a resumed iterator (the position in the stream) redraws exactly what an
uninterrupted run would have.
"""

from __future__ import annotations

import io
import json
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grain
import numpy as np

from pax_eqx.config import ConfigError, MissingFileError
from pax_eqx.data import inception_crop
from pax_eqx.data.host_sharding import HostShard, PadToLength, batch_host_examples, padded_shard_length, shard_examples
from pax_eqx.data.input import Input
from pax_eqx.data.input_config import InputConfig, Split

if TYPE_CHECKING:
    from pax_eqx.data.augment import AugmentConfig

SPLIT_FOLDERS = {"train": "train", "eval": "val"}
MANIFEST = "images.json"
FORMAT = "pax_eqx.encoded_images"
_LABEL = struct.Struct("<i")


# --- records: label + encoded bytes -------------------------------------------------------------


def encode_record(label: int, data: bytes) -> bytes:
    """One ArrayRecord record: the label as int32 little-endian, then the image file's bytes."""
    return _LABEL.pack(int(label)) + bytes(data)


def decode_record(record: bytes) -> tuple[int, bytes]:
    """(label, encoded image bytes) of a record written by `encode_record`."""
    return _LABEL.unpack_from(record)[0], record[_LABEL.size :]


# --- the two storages, as grain sources of (index, label, encoded) ------------------------------


class EncodedImageFiles(grain.sources.RandomAccessDataSource):
    """source[i] = (i, label_i, path of image file i); nothing is read until the view decodes it."""

    def __init__(self, files: list[Path], labels: np.ndarray):
        self._files = [str(f) for f in files]
        self._labels = np.asarray(labels, np.int32)

    def __len__(self) -> int:
        return len(self._files)

    def __getitem__(self, index: int) -> tuple[int, np.int32, str]:
        return int(index), self._labels[index], self._files[index]

    def empty_files(self) -> list[str]:
        """The files of 0 bytes (one stat each, nothing read)."""
        return [f for f in self._files if os.stat(f).st_size == 0]

    def __repr__(self) -> str:
        return f"EncodedImageFiles({len(self)} files)"


class EncodedImageRecords(grain.sources.RandomAccessDataSource):
    """source[i] = (i, label_i, encoded bytes of record i) of ArrayRecord shards (read lazily)."""

    def __init__(self, paths: list[str]):
        self._records = grain.sources.ArrayRecordDataSource(paths)

    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, index: int) -> tuple[int, np.int32, bytes]:
        label, data = decode_record(self._records[index])
        return int(index), np.int32(label), data

    def __repr__(self) -> str:
        return f"EncodedImageRecords({len(self)} records)"


def split_folder(root: str, split: Split, field: str = "data.path") -> str:
    """`<root>/train` or `<root>/val`, which must exist; errors name `field` and the layout."""
    if not root.strip():
        raise ConfigError(
            f"{field} is empty; the ImageNet sources read <root>/train/<wnid>/*.JPEG and <root>/val/<wnid>/*.JPEG "
            "(--data.path /data/imagenet), or train on random images without files: --data.source synthetic_images."
        )
    folder = os.path.join(os.path.expanduser(root), SPLIT_FOLDERS[split])
    if not os.path.isdir(folder):
        raise MissingFileError(
            f"{field}={root!r} has no {SPLIT_FOLDERS[split]}/ folder for the {split} split; lay ImageNet out as "
            "<root>/train/<wnid>/*.JPEG and <root>/val/<wnid>/*.JPEG (docs/data.md)."
        )
    return folder


def class_names(folder: str, field: str) -> list[str]:
    """The class folders of a split folder, sorted (label ids 0, 1, ...), without listing files."""
    names = sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))
    if not names:
        raise MissingFileError(f"{field}: {folder!r} has no class folders; lay it out as <split>/<wnid>/*.JPEG.")
    return names


def folder_source(root: str, split: Split, field: str = "data.path") -> tuple[EncodedImageFiles, list[str]]:
    """The split's files of the folder layout and the class names (the train folder's, sorted).
    Only the split's own files are listed (ImageNet's train split is 1.28 M of them)."""
    from pax_eqx.data.images import folder_files

    train_classes = class_names(split_folder(root, "train", field), field)
    by_class = folder_files(split_folder(root, split, field), field)
    ids = {name: i for i, name in enumerate(train_classes)}
    unknown = [c for c in by_class if c not in ids]
    if unknown:
        raise ConfigError(
            f"{field}={root!r}: val/ has class folder(s) {unknown[:5]} that train/ lacks; both splits must use "
            "the same class folders (the wnids)."
        )
    files = [f for c in by_class for f in by_class[c]]
    labels = np.concatenate([np.full(len(by_class[c]), ids[c], np.int32) for c in by_class])
    return EncodedImageFiles(files, labels), train_classes


def read_images_manifest(directory: str, field: str) -> dict[str, Any]:
    """`directory`/images.json (image_records.py), checked for its format and its shards' files."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        raise MissingFileError(
            f"{field}: {directory!r} has no {MANIFEST}: it was not written by python -m pax_eqx.prepare_images "
            "(or the write did not finish); write it again."
        )
    with open(path, encoding="utf-8") as f:
        manifest = json.load(f)
    if manifest.get("format") != FORMAT:
        raise ConfigError(f"{field}: {path!r} is not an encoded-images manifest (format {manifest.get('format')!r}).")
    missing = [s["file"] for s in manifest["shards"] if not os.path.isfile(os.path.join(directory, s["file"]))]
    if missing:
        raise MissingFileError(
            f"{field}: {directory!r} lacks {len(missing)} shard file(s) its {MANIFEST} lists (first {missing[0]!r}); "
            "copy the whole directory again, or write it again."
        )
    from pax_eqx.data.prepare import integrity  # each shard's size and fingerprint against the manifest's

    integrity.verify_shards(
        directory,
        manifest["shards"],
        f"{field}={directory!r}",
        "copy the whole directory again, or write it again with python -m pax_eqx.prepare_images.",
    )
    return manifest


def records_source(root: str, split: Split, field: str = "data.path") -> tuple[EncodedImageRecords, list[str]]:
    """The split's records of the ArrayRecord layout and the class names (its manifest's)."""
    train_dir = split_folder(root, "train", field)
    classes = read_images_manifest(train_dir, field)["classes"]
    directory = split_folder(root, split, field)
    manifest = read_images_manifest(directory, field)
    if manifest["classes"] != classes:
        raise ConfigError(
            f"{field}={root!r}: val/{MANIFEST} lists other classes than train/{MANIFEST}; write both splits with one "
            "python -m pax_eqx.prepare_images run."
        )
    try:
        source = EncodedImageRecords([os.path.join(directory, s["file"]) for s in manifest["shards"]])
    except (RuntimeError, OSError, ValueError) as e:  # shards written before images.json had their fingerprints
        raise ConfigError(
            f"{field}={root!r}: the {SPLIT_FOLDERS[split]}/ shards cannot be read ({e}): a shard was cut short or "
            "overwritten; copy the directory again, or write it again with python -m pax_eqx.prepare_images."
        ) from None
    if len(source) != manifest["num_records"]:
        raise ConfigError(
            f"{field}={root!r}: the {SPLIT_FOLDERS[split]}/ shards hold {len(source)} records but its {MANIFEST} "
            f"{manifest['num_records']}: a shard was replaced or cut short; copy the directory again."
        )
    return source, classes


# --- decoding and the views ---------------------------------------------------------------------


def decode(encoded: str | bytes, channels: int, index: int):
    """The PIL image of a file path or encoded bytes, as RGB (channels 3) or grayscale (1)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(encoded if isinstance(encoded, str) else io.BytesIO(encoded)) as img:
            return img.convert("L" if channels == 1 else "RGB")
    except (OSError, UnidentifiedImageError) as e:
        where = repr(encoded) if isinstance(encoded, str) else f"record {index}"
        raise ConfigError(f"data.path: {where} is not a readable image ({e}); remove or replace it.") from None


DECODE_ALL_UP_TO = 500
"""`check_decodable` decodes every image of a split this small, and a sample of this many spread
evenly over a larger one (module doc of programs/preflight.py: the measured cost)."""


def check_decodable(
    source: EncodedImageFiles | EncodedImageRecords, channels: int, root: str, split: Split,
    limit: int = DECODE_ALL_UP_TO,
) -> None:  # fmt: skip
    """ConfigError naming an image of `source` (`split`'s records of `root`) that cannot be decoded,
    before a run starts rather than when a batch holding it is read: every file's size (a stat
    each; records are read, so only sampled), then every image decoded when there are at most
    `limit`, else `limit` of them spread evenly (first and last included), in threads (Pillow
    decodes without the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    where = f"data.path={root!r}: the {split} image"
    if isinstance(source, EncodedImageFiles):
        empty = source.empty_files()
        if empty:
            more = f" (and {len(empty) - 1} more)" if len(empty) > 1 else ""
            raise ConfigError(f"{where} {empty[0]!r} is empty (0 bytes){more}; remove or replace it.")
    count = len(source)
    picked = range(count) if count <= limit else sorted({int(i) for i in np.linspace(0, count - 1, limit).round()})

    def read(index: int) -> None:
        _, _, encoded = source[index]
        try:
            decode(encoded, channels, index)
        except ConfigError as e:
            named = repr(encoded) if isinstance(encoded, str) else f"record {index}"
            reason = str(e).split(" is not a readable image ", 1)[-1]
            raise ConfigError(f"{where} {named} is not a readable image {reason}") from None

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        for _ in pool.map(read, picked):  # the first failure, in order
            pass


def _example(pixels: np.ndarray, label, mean: np.ndarray | None, std: np.ndarray | None) -> dict[str, Any]:
    x = pixels.astype(np.float32) / 255.0
    if mean is not None:
        x = ((x - mean) / std).astype(np.float32)
    return {"inputs": x, "labels": np.int32(label), "weights": np.float32(1.0)}


class _View:
    def __init__(self, shape: tuple[int, int, int], mean: tuple[float, ...], std: tuple[float, ...]):
        self.size, _, self.channels = shape
        self.mean = np.asarray(mean, np.float32) if mean else None
        self.std = np.asarray(std, np.float32) if std else None


class EvalView(_View, grain.transforms.Map):
    """(index, label, encoded) -> the example of its central crop (module doc)."""

    def map(self, element: tuple[int, Any, Any]) -> dict[str, Any]:
        index, label, encoded = element
        image = decode(encoded, self.channels, index)
        box = inception_crop.central_box(image.height, image.width, self.size)
        return _example(inception_crop.crop_resize(image, box, self.size), label, self.mean, self.std)


def train_draw(seed: int, index: int, epoch: int, height: int, width: int, size: int, flip: bool):
    """(crop box, whether to flip) of example `index` in `epoch`: the only randomness of training."""
    rng = np.random.default_rng([seed, index, epoch])
    box = inception_crop.random_resized_box(height, width, size, rng)
    return box, bool(flip and rng.random() < 0.5)


class TrainView(_View, grain.transforms.MapWithIndex):
    """(k, (index, label, encoded)) -> the example of its random-resized crop and flip, drawn
    from (seed, index, epoch = k // per_epoch) (module doc)."""

    def __init__(self, shape, mean, std, *, flip: bool, seed: int, per_epoch: int):
        super().__init__(shape, mean, std)
        self.flip, self.seed, self.per_epoch = flip, seed, per_epoch

    def map_with_index(self, position: int, element: tuple[int, Any, Any]) -> dict[str, Any]:
        index, label, encoded = element
        image = decode(encoded, self.channels, index)
        box, flip = train_draw(self.seed, index, position // self.per_epoch, image.height, image.width, self.size,
                               self.flip)  # fmt: skip
        pixels = inception_crop.crop_resize(image, box, self.size)
        return _example(pixels[:, ::-1] if flip else pixels, label, self.mean, self.std)


def _padding(shape: tuple[int, int, int]) -> dict[str, Any]:
    return {"inputs": np.zeros(shape, np.float32), "labels": np.int32(0), "weights": np.float32(0.0)}


def check_image_shape(image_shape: tuple[int, ...], kind: str) -> tuple[int, int, int]:
    """data.image_shape as (S, S, C): the model's square input, C = 1 or 3."""
    shape = tuple(image_shape)
    if len(shape) != 3 or shape[0] != shape[1] or shape[2] not in (1, 3):
        raise ConfigError(
            f"data.image_shape={shape} but data.source={kind!r} crops square images of the model's size with "
            "1 or 3 channels; set it, e.g. --data.image-shape 224 224 3."
        )
    return shape  # type: ignore[return-value]


def imagenet_input(
    items: grain.MapDataset,
    shape: tuple[int, int, int],
    aug: AugmentConfig,
    cfg: InputConfig,
    split: Split,
    shard: HostShard,
    root: str,
) -> Input:
    """This host's Input of `split` (module doc) over `items`, the split's (index, label, encoded)
    records of `root`, cropped to `shape`. Batches: inputs [B, S, S, C] float32, labels [B] int32,
    weights [B] float32 (0 for the padding rows of a finite epoch)."""
    if len(items) == 0:
        raise ConfigError(f"data.path={root!r}: the {split} split has no images.")
    if split == "eval":
        batches, per_epoch = batch_host_examples(items.map(EvalView(shape, aug.mean, aug.std)), cfg, shard,
                                                 _padding(shape))  # fmt: skip
        return Input(batches, cfg, split=split, shard=shard, num_batches_per_epoch=per_epoch)
    mine = shard_examples(items, cfg, shard)
    per_host = len(range(shard.index, len(items), shard.count))
    view = TrainView(shape, aug.mean, aug.std, flip=aug.horizontal_flip, seed=cfg.input_random_seed,
                     per_epoch=max(per_host, 1))  # fmt: skip
    examples = mine.map_with_index(view)
    per_epoch = None
    if not cfg.repeat:
        length = padded_shard_length(len(items), cfg.batch_size, shard.count)
        examples = PadToLength(examples, length, _padding(shape))
        per_epoch = length // cfg.batch_size
    batches = examples.batch(cfg.batch_size, drop_remainder=True)
    return Input(batches, cfg, split=split, shard=shard, num_batches_per_epoch=per_epoch)
