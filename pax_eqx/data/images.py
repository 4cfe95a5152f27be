"""Image classification examples: in-memory arrays, a `.npz` file, a folder of image files, and
scikit-learn's digits as 8x8x1 images.

    {"inputs": float32[H, W, C], "labels": int32 (class id), "weights": float32 (1 real, 0 padding)}

Pixel values: uint8 images are scaled to 0..1 (x / 255), uint16 to 0..1 (x / 65535), float
images are kept as they are; digits are 0..16 scaled to 0..1. Normalisation to a mean and std
is the augment config's job (augment.py), so one place decides what the model sees.

Sources (`data.source`; each one's config is a file of sources/):

- `images_npz`: one `.npz` file at `data.path` with `images` [N, H, W] or [N, H, W, C] and
  `labels` [N] (integers). [N, H, W] becomes [N, H, W, 1].
- `image_folder`: `data.path` is a folder `root/<class_name>/*.png|jpg|jpeg`, decoded lazily
  with Pillow. Classes sorted by name are label ids 0, 1, ...; an eval folder at
  `data.eval_path` must use (a subset of) the same class names, which keep their train ids.
  Every image must have the same size (checked from the headers when the input is built).
  All-grayscale folders give C = 1; any colour image makes every image RGB (C = 3; alpha
  dropped).
- `digits_images`: scikit-learn's 1,797 digits (digits.py, the same split) as [8, 8, 1]. A
  separate source name rather than a layout field on `digits`: the flat `digits` source
  (inputs [64], the `digits_mlp` experiment) stays as it is, the name in config.json says which
  shape a model gets, and no DataConfig field exists that only one source reads.
- `synthetic_images`: `data.num_synthetic_examples` images of `data.image_shape` per split,
  pixels uniform in [0, 1) drawn from a generator seeded with (split, index) -- the same image
  for an index on every host, epoch and run, different between train and eval -- and label 0
  for every image (like Pax's SyntheticLmData, whose ids are all ones: any classifier takes
  them, whatever its class count). For speed and plumbing (ImageNet's shapes without ImageNet),
  not learning. A separate source rather than `synthetic` (the LM source): that one yields
  token rows of `data.seq_len`; the name in config.json says which one a model gets.
- `imagenet_folder`, `imagenet_array_record`: ImageNet's JPEGs of any size, decoded when read
  and cropped as Pax's ImageNet input crops them (imagenet_source.py: Inception's random-resized
  crop and a flip for training, the central crop for eval, to `data.image_shape`).
- in memory: `array_image_examples(images, labels)` and `held_out_indices` for a
  `data.custom_input` function; `image_input` batches them like the sources above.

Eval split: `data.eval_path` (npz and folder), else a fixed seeded held-out fraction: the last
`eval_fraction` of a permutation seeded with 0, the same on every host and in every run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grain
import numpy as np

from pax_eqx.config import ConfigError, MissingFileError
from pax_eqx.data import augment, digits
from pax_eqx.data.file_readers import array_examples
from pax_eqx.data.host_sharding import HostShard, batch_host_examples, zeros_like_example
from pax_eqx.data.input import Input
from pax_eqx.data.input_config import InputConfig, Split

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
DIGITS_SHAPE = (8, 8, 1)
_SPLIT_SEED = 0
_GRAY_MODES = ("1", "L", "I", "I;16", "F")
_SYNTHETIC_SPLIT_SEEDS = {"train": 0, "eval": 1}


def to_float_images(images: Any, where: str) -> np.ndarray:
    """[N, H, W] or [N, H, W, C] of uint8 / uint16 / float -> float32 [N, H, W, C] (module doc)."""
    images = np.asarray(images)
    if images.ndim not in (3, 4):
        raise ConfigError(f"{where}: images must be [N, H, W] or [N, H, W, C], got shape {images.shape}.")
    if images.ndim == 3:
        images = images[..., None]
    if images.dtype == np.uint8:
        return images.astype(np.float32) / 255.0
    if images.dtype == np.uint16:
        return images.astype(np.float32) / 65535.0
    if np.issubdtype(images.dtype, np.floating):
        return images.astype(np.float32)
    raise ConfigError(f"{where}: images of dtype {images.dtype} are not supported; use uint8, uint16 or float.")


def _check_labels(labels: Any, num_images: int, where: str) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.shape != (num_images,) or not np.issubdtype(labels.dtype, np.integer):
        raise ConfigError(
            f"{where}: labels must be integers of shape [{num_images}] (one per image), got {labels.dtype} "
            f"{labels.shape}."
        )
    if num_images and labels.min() < 0:
        raise ConfigError(f"{where}: labels must be class ids >= 0, got {labels.min()}.")
    return labels.astype(np.int32)


def array_image_examples(images: Any, labels: Any, where: str = "images") -> grain.MapDataset:
    """Examples from in-memory arrays: images [N, H, W(, C)], labels [N]."""
    x = to_float_images(images, where)
    y = _check_labels(labels, len(x), where)
    return array_examples({"inputs": x, "labels": y, "weights": np.ones(len(x), np.float32)})


def held_out_indices(num: int, split: Split, eval_fraction: float, where: str) -> np.ndarray:
    """The split's indices of `num` examples: the last `eval_fraction` of a seeded permutation is eval."""
    num_eval = max(1, round(num * eval_fraction))
    if num_eval >= num:
        raise ConfigError(
            f"{where}: {num} image(s) are too few to hold out {eval_fraction:.0%} for eval and train on the rest; "
            "add images or set data.eval_path."
        )
    order = np.random.default_rng(_SPLIT_SEED).permutation(num)
    return np.sort(order[-num_eval:] if split == "eval" else order[:-num_eval])


# --- .npz ---------------------------------------------------------------------------------------


def npz_file(spec: str, field: str) -> Path:
    """The one .npz file `spec` names, with `images` and `labels` in it; errors name `field`."""
    if not spec.strip():
        raise ConfigError(f"{field} is empty; set it to a .npz file holding `images` and `labels`.")
    path = Path(spec).expanduser()
    if not path.is_file():
        raise MissingFileError(f"{field}={spec!r} does not exist; give a local .npz file with `images` and `labels`.")
    try:
        with np.load(path, allow_pickle=False) as f:
            keys = list(f.files)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{field}={spec!r} is not a readable .npz file ({e}).") from None
    missing = [k for k in ("images", "labels") if k not in keys]
    if missing:
        raise ConfigError(
            f"{field}={spec!r} has no {' or '.join(repr(k) for k in missing)} array (it has {keys}); save it with "
            "np.savez(path, images=[N, H, W(, C)], labels=[N])."
        )
    return path


def npz_examples(spec: str, field: str, split: Split | None, eval_fraction: float) -> grain.MapDataset:
    """The file's examples; `split` "train"/"eval" keeps that held-out part, None all of them."""
    path = npz_file(spec, field)
    with np.load(path, allow_pickle=False) as f:
        x = to_float_images(f["images"], f"{field}={spec!r}")
        y = _check_labels(f["labels"], len(x), f"{field}={spec!r}")
    if split is not None:
        keep = held_out_indices(len(x), split, eval_fraction, f"{field}={spec!r}")
        x, y = x[keep], y[keep]
    return array_examples({"inputs": x, "labels": y, "weights": np.ones(len(x), np.float32)})


# --- folder of image files ----------------------------------------------------------------------


def folder_files(spec: str, field: str) -> dict[str, list[Path]]:
    """{class_name: sorted image files} of `root/<class_name>/...`, classes sorted by name."""
    if not spec.strip():
        raise ConfigError(f"{field} is empty; set it to a folder laid out as root/<class_name>/*.png|jpg|jpeg.")
    root = Path(spec).expanduser()
    if not root.is_dir():
        raise MissingFileError(
            f"{field}={spec!r} is not an existing folder; give a local folder laid out as "
            "root/<class_name>/*.png|jpg|jpeg."
        )
    classes = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise MissingFileError(
            f"{field}={spec!r} has no class folders; lay the images out as root/<class_name>/*.png|jpg|jpeg."
        )
    found = {}
    for c in classes:
        files = sorted(
            p for p in c.rglob("*") if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_SUFFIXES
        )
        if not files:
            raise MissingFileError(f"{field}={spec!r}: the class folder {c.name!r} has no .png/.jpg/.jpeg files.")
        found[c.name] = files
    return found


class ImageFolderSource(grain.sources.RandomAccessDataSource):
    """source[i] = example of image file i, decoded with Pillow when read (picklable for workers)."""

    def __init__(self, files: list[Path], labels: np.ndarray, channels: int):
        self._files = [str(f) for f in files]
        self._labels = labels
        self._mode = "L" if channels == 1 else "RGB"

    def __len__(self) -> int:
        return len(self._files)

    def __getitem__(self, index: int) -> dict[str, Any]:
        from PIL import Image

        with Image.open(self._files[index]) as img:
            pixels = np.asarray(img.convert(self._mode), np.uint8)
        if pixels.ndim == 2:
            pixels = pixels[..., None]
        return {
            "inputs": pixels.astype(np.float32) / 255.0,
            "labels": self._labels[index],
            "weights": np.float32(1.0),
        }

    def __repr__(self) -> str:
        return f"ImageFolderSource({len(self)} images, mode {self._mode})"


def _scan_headers(files: list[Path], spec: str, field: str) -> int:
    """Checks every image has the first one's size (from the headers); returns the channel count."""
    from PIL import Image, UnidentifiedImageError

    size = None
    gray = True
    for f in files:
        try:
            with Image.open(f) as img:
                this_size, mode = img.size, img.mode
        except (OSError, UnidentifiedImageError) as e:
            raise ConfigError(f"{field}={spec!r}: {str(f)!r} is not a readable image ({e}).") from None
        if size is None:
            size, first = this_size, f
        elif this_size != size:
            raise ConfigError(
                f"{field}={spec!r}: {str(f)!r} is {this_size[0]}x{this_size[1]} (width x height) but {str(first)!r} "
                f"is {size[0]}x{size[1]}; every image must have the same size (resize them first)."
            )
        gray = gray and mode in _GRAY_MODES
    return 1 if gray else 3


def image_folder_examples(
    spec: str,
    field: str,
    split: Split | None,
    eval_fraction: float,
    class_names: list[str] | None = None,
) -> grain.MapDataset:
    """The folder's examples; `split` keeps a held-out part, None all. `class_names` (the train
    folder's) fixes the label ids; by default the folder's own sorted class names."""
    by_class = folder_files(spec, field)
    names = list(by_class) if class_names is None else class_names
    unknown = [c for c in by_class if c not in names]
    if unknown:
        raise ConfigError(
            f"{field}={spec!r} has class folder(s) {unknown} that the training folder (data.path) lacks; "
            f"the classes are {names}."
        )
    files = [f for c in by_class for f in by_class[c]]
    ids = {name: i for i, name in enumerate(names)}  # not names.index per file: O(classes) each
    labels = np.array([ids[c] for c in by_class for _ in by_class[c]], np.int32)
    if split is not None:
        keep = held_out_indices(len(files), split, eval_fraction, f"{field}={spec!r}")
        files, labels = [files[i] for i in keep], labels[keep]
    channels = _scan_headers(files, spec, field)
    return grain.MapDataset.source(ImageFolderSource(files, labels, channels))


# --- digits -------------------------------------------------------------------------------------


def _digit_image(example: dict[str, Any]) -> dict[str, Any]:
    return {**example, "inputs": example["inputs"].reshape(DIGITS_SHAPE)}


def digits_image_examples(split: Split, eval_fraction: float) -> grain.MapDataset:
    """scikit-learn's digits as [8, 8, 1] images (values 0..1), digits.py's split."""
    return digits.digits_examples(split, eval_fraction).map(_digit_image)


# --- synthetic ----------------------------------------------------------------------------------


def check_image_shape_field(shape: Any, field: str = "data.image_shape") -> tuple[int, int, int]:
    """`shape` as (H, W, C) of positive ints, or a ConfigError naming `field`."""
    shape = tuple(shape)
    if len(shape) != 3 or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise ConfigError(f"{field} must be 3 positive sizes (height, width, channels), e.g. 224 224 3; got {shape}.")
    return shape  # type: ignore[return-value]


class SyntheticImages(grain.sources.RandomAccessDataSource):
    """source[i] = random image i of `shape` (uniform [0, 1), seeded by (split seed, i)), label 0."""

    def __init__(self, num: int, shape: tuple[int, int, int], split: Split):
        self._num = num
        self._shape = check_image_shape_field(shape)
        self._seed = _SYNTHETIC_SPLIT_SEEDS[split]

    def __len__(self) -> int:
        return self._num

    def __getitem__(self, index: int) -> dict[str, Any]:
        rng = np.random.default_rng((self._seed, int(index)))
        return {
            "inputs": rng.random(self._shape, dtype=np.float32),
            "labels": np.int32(0),
            "weights": np.float32(1.0),
        }

    def __repr__(self) -> str:
        return f"SyntheticImages({self._num} images of {self._shape})"


def synthetic_image_examples(num: int, shape: tuple[int, ...], split: Split) -> grain.MapDataset:
    """`num` random images of `shape` [H, W, C] for `split` (module doc), label 0."""
    if num <= 0:
        raise ConfigError(f"data.num_synthetic_examples must be > 0, got {num}.")
    return grain.MapDataset.source(SyntheticImages(num, check_image_shape_field(shape), split))


def image_input(
    examples: grain.MapDataset,
    cfg: InputConfig,
    augment_cfg: augment.AugmentConfig,
    split: Split,
    shard: HostShard,
    source: str = "images",
    image_shape: tuple[int, ...] = (),
) -> Input:
    """This host's Input over image `examples`: normalised (both splits), sharded, shuffled and
    padded like every source (`batch_host_examples`), batched, then randomly cropped / flipped
    (train only). Batches: inputs [B, H, W, C] float32, labels [B] int32, weights [B] float32.
    `image_shape` (data.image_shape), when given, must be the images' [H, W, C]."""
    if len(examples) == 0:
        raise ConfigError(f"data.source={source!r}: the {split} split has no images.")
    first = examples[0]
    shape = tuple(np.shape(first["inputs"]))
    if len(shape) != 3:
        raise ConfigError(f"data.source={source!r}: image inputs must be [H, W, C], got {shape}.")
    if image_shape and shape != tuple(image_shape):
        raise ConfigError(
            f"data.image_shape={tuple(image_shape)} but data.source={source!r} gives {split} images of shape {shape} "
            "[H, W, C]; resize the images, or set data.image_shape to their shape (or leave it empty)."
        )
    augment_cfg.check_image_shape(shape, source)
    examples = augment.normalize_examples(examples, augment_cfg)
    batches, per_epoch = batch_host_examples(examples, cfg, shard, zeros_like_example(first))
    if split == "train":
        batches = augment.augment_batches(batches, augment_cfg, cfg.input_random_seed, shard.index)
    return Input(batches, cfg, split=split, shard=shard, num_batches_per_epoch=per_epoch)


def example_from_file(
    path: str, input_shape: tuple[int, ...], normalization: augment.AugmentConfig
) -> dict[str, np.ndarray]:
    """One example's `inputs` read from a file the way the data sources would give it: an image
    (.png/.jpg/.jpeg, decoded by Pillow to the channels of `input_shape` = (H, W, C), uint8
    scaled to 0..1) or a `.npy` array of exactly `input_shape`; then the data's normalisation
    (`normalization.mean` / `std`, data.augment), as the eval split gets it. MissingFileError /
    ConfigError name the file and what it should be."""
    file = Path(path)
    if not file.is_file():
        raise MissingFileError(f"decode.inputs: {path!r} is not a file; pass existing image or .npy files.")
    shape = tuple(input_shape)
    if file.suffix.lower() == ".npy":
        try:
            pixels = np.load(file, allow_pickle=False).astype(np.float32)
        except (OSError, ValueError) as e:
            raise ConfigError(f"decode.inputs: {path!r} is not a readable .npy array ({e}).") from None
        if pixels.shape != shape:
            raise ConfigError(
                f"decode.inputs: {path!r} holds an array of shape {pixels.shape}, but the model takes {shape}; "
                "save each example as one array of the model's input_shape."
            )
    else:
        if len(shape) != 3 or shape[-1] not in (1, 3):
            raise ConfigError(
                f"decode.inputs: {path!r} is an image, but the model takes inputs of shape {shape}, not images "
                "(height, width, 1 or 3 channels); pass .npy arrays of that shape instead."
            )
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(file) as img:
                pixels = np.asarray(img.convert("L" if shape[-1] == 1 else "RGB"))
        except (OSError, UnidentifiedImageError) as e:
            raise ConfigError(f"decode.inputs: {path!r} is not a readable image ({e}).") from None
        pixels = (pixels[..., None] if pixels.ndim == 2 else pixels).astype(np.float32) / 255.0
        if pixels.shape != shape:
            raise ConfigError(
                f"decode.inputs: {path!r} is {pixels.shape[1]}x{pixels.shape[0]} (width x height), but the model "
                f"takes {shape[1]}x{shape[0]} images; resize it first."
            )
    example = {"inputs": pixels}
    if normalization.normalizes:
        return augment.Normalize(normalization.mean, normalization.std).map(example)
    return example
