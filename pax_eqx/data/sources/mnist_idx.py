"""`--data.source mnist_idx --data.path DIR`: MNIST from its four IDX files, as LeCun's site
distributes them, read with numpy; nothing is downloaded at run time.

    DIR/train-images-idx3-ubyte   train-labels-idx1-ubyte    the train split (60,000)
    DIR/t10k-images-idx3-ubyte    t10k-labels-idx1-ubyte     the eval split (10,000)

Each file may also be gzipped as the site serves it (`train-images-idx3-ubyte.gz`); the plain
file is read where both exist. IDX: a big-endian magic number (two zero bytes, the element type
0x08 = unsigned byte, the number of dimensions), each dimension as a big-endian int32, then the
elements. Images are 0x00000803 ([N, 28, 28]), labels 0x00000801 ([N]).

Examples are what Paxml's MNIST input gives (paxml/tasks/vision/params/mnist.py, `_get_dataset`:
`tf.cast(image, tf.float32)` then `image /= 255.0`): `inputs` [28, 28, 1] float32 = pixel / 255
in [0, 1], no mean or std (`data.augment` is empty; set its mean/std for more), `labels` int32
0..9, `weights` 1 (0 on an eval epoch's padding rows). The split is MNIST's own: train = the
train files, eval = t10k (Paxml's TFDS "train" and "test"). Batching, host sharding, the
per-epoch shuffle and the padded eval epoch are every image source's (images.image_input).

A missing directory or file, a wrong magic number, a file cut short, images that are not 28x28,
labels outside 0..9, or image and label counts that disagree are refused in one line naming
data.path, the value and the fix, when the experiment is checked (the headers) or the split is
read (the elements).
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import ClassVar

import numpy as np

from pax_eqx.config import ConfigError, MissingFileError, config
from pax_eqx.data import images
from pax_eqx.data.data_source import ExampleSpec, ImageSource

IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dimensions
LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dimension
SPLIT_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "eval": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_ALL_FILES = ", ".join(name for pair in SPLIT_FILES.values() for name in pair)
_NO_DOWNLOAD = "nothing is downloaded at run time"


@config
class MnistIdxSource(ImageSource):
    """path: the directory holding the four IDX files (plain or .gz)."""

    kind: ClassVar[str] = "mnist_idx"

    path: str = ""

    def validate(self) -> None:
        super().validate()
        if self.image_shape and tuple(self.image_shape) != IMAGE_SHAPE:
            raise ConfigError(
                f"data.image_shape={tuple(self.image_shape)} but {self.flag} gives {IMAGE_SHAPE} images; set "
                f"data.image_shape to {IMAGE_SHAPE} or leave it empty."
            )

    def example_spec(self) -> ExampleSpec:
        return ExampleSpec(IMAGE_SHAPE, NUM_CLASSES)

    def describe(self, data) -> str:
        return f"{self.flag} path={self.path!r} augment={self.augment!r}"

    def check(self, data, files: bool) -> None:
        super().check(data, files)
        if files:
            for split in SPLIT_FILES:
                self._split_files(split, headers_only=True)

    def split_examples(self, split):
        (_, pixels), (_, labels) = self._split_files(split, headers_only=False)
        if labels.size and labels.max() >= NUM_CLASSES:
            raise ConfigError(
                f"data.path={self.path!r}: a {split} label is {labels.max()}, but MNIST's are 0..9; "
                f"download the four IDX files again from the MNIST site into {self.path}."
            )
        return images.array_image_examples(pixels, labels, f"data.path={self.path!r}")

    def _split_files(self, split, headers_only: bool) -> tuple[tuple[tuple[int, ...], np.ndarray], ...]:
        """((dims, elements) of the split's images, of its labels), the counts agreeing; elements
        are empty with `headers_only`."""
        directory = self._directory()
        images_file, labels_file = (_find(directory, name, self.path) for name in SPLIT_FILES[split])
        image_dims, pixels = _read_idx(images_file, IMAGES_MAGIC, self.path, headers_only)
        label_dims, labels = _read_idx(labels_file, LABELS_MAGIC, self.path, headers_only)
        images_name, labels_name = images_file.name, labels_file.name
        if tuple(image_dims[1:]) != IMAGE_SHAPE[:2]:
            raise ConfigError(
                f"data.path={self.path!r}: {images_name} holds {image_dims[1]}x{image_dims[2]} images, not MNIST's "
                f"28x28; download the four IDX files again from the MNIST site into {self.path}."
            )
        if image_dims[0] != label_dims[0]:
            raise ConfigError(
                f"data.path={self.path!r}: {images_name} holds {image_dims[0]} images but {labels_name} "
                f"{label_dims[0]} labels; download both again from the MNIST site into {self.path}."
            )
        return (image_dims, pixels), (label_dims, labels)

    def _directory(self) -> Path:
        if not self.path.strip():
            raise ConfigError(
                f"data.path is empty; {self.flag} reads MNIST's four IDX files ({_ALL_FILES}; each plain or .gz) "
                f"from a directory: download them from the MNIST site into DIR and pass --data.path DIR; "
                f"{_NO_DOWNLOAD}."
            )
        directory = Path(self.path).expanduser()
        if not directory.is_dir():
            raise MissingFileError(
                f"data.path={self.path!r} is not an existing directory; download MNIST's four IDX files "
                f"({_ALL_FILES}; each plain or .gz) from the MNIST site into it; {_NO_DOWNLOAD}."
            )
        return directory


def _find(directory: Path, name: str, spec: str) -> Path:
    """DIR/name, else DIR/name.gz."""
    for candidate in (directory / name, directory / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise MissingFileError(
        f"data.path={spec!r} has no {name} (nor {name}.gz); download it from the MNIST site into {spec}; "
        f"{_NO_DOWNLOAD}."
    )


def _read_idx(file: Path, magic: int, spec: str, headers_only: bool) -> tuple[tuple[int, ...], np.ndarray]:
    """(dims, elements as uint8 [dims]) of the IDX file, whose magic number must be `magic`; the
    elements are read (and their count checked) unless `headers_only`."""
    ndim = magic & 0xFF
    header_size = 4 + 4 * ndim
    again = f"download it again from the MNIST site into {spec}"
    try:
        with gzip.open(file, "rb") if file.suffix == ".gz" else file.open("rb") as f:
            raw = f.read(header_size if headers_only else -1)
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise ConfigError(f"data.path={spec!r}: {file.name} is not readable ({e}); {again}.") from None
    found = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
    if found != magic:
        what = "images" if magic == IMAGES_MAGIC else "labels"
        seen = "fewer than 4 bytes" if found is None else f"magic number 0x{found:08X}"
        raise ConfigError(
            f"data.path={spec!r}: {file.name} has {seen}, not 0x{magic:08X} (IDX {what}: unsigned bytes in {ndim} "
            f"dimension{'s' if ndim > 1 else ''}); {again}."
        )
    if len(raw) < header_size:
        raise ConfigError(f"data.path={spec!r}: {file.name} ends inside its header; {again}.")
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    if headers_only:
        return dims, np.zeros((0,), np.uint8)
    size = int(np.prod(dims))
    if len(raw) - header_size != size:
        raise ConfigError(
            f"data.path={spec!r}: {file.name} holds {len(raw) - header_size} bytes after its header, but its "
            f"dimensions {list(dims)} need {size}; {again}."
        )
    return dims, np.frombuffer(raw, np.uint8, offset=header_size).reshape(dims)
