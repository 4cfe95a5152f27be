"""ImageNet at the source (imagenet_source.py, inception_crop.py, image_records.py): tiny JPEGs of
mixed sizes written here with Pillow, read as JPEG files and as ArrayRecord shards of their
bytes, each crop recomputed from its box by hand, the boxes' bounds over many draws, grain
workers, host slices and resume."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from PIL import Image

from pax_eqx.config import ConfigError, MissingFileError
from pax_eqx.data import (
    DataConfig,
    ImagenetArrayRecordSource,
    ImagenetFolderSource,
    InputConfig,
    build_input,
)
from pax_eqx.data.augment import AugmentConfig
from pax_eqx.data.image_records import write_image_records
from pax_eqx.data.imagenet_source import train_draw
from pax_eqx.data.inception_crop import AREA_RANGE, ASPECT_RANGE, Box, central_box, random_resized_box
from pax_eqx.data.tokenizers import ByteTokenizer
from pax_eqx.prepare_images import main as image_records_main

S = 16  # the model's image side in these tests
CLASSES = ("n01440764", "n01443537", "n01484850")
PER_CLASS = {"train": 8, "val": 2}
ONE_HOST = {"num_infeed_hosts": 1, "infeed_host_index": 0}
TOKENIZER = ByteTokenizer()  # what build_tokenizer gives an image source; unused by it


@pytest.fixture(scope="module")
def imagenet(tmp_path_factory):
    """root/train/<wnid>/*.JPEG (24) and root/val/<wnid>/*.JPEG (6): random pixels, sizes 20..63,
    and val's first image 48 x 60, whose central crop is exactly 16 x 16 (no resize)."""
    root = tmp_path_factory.mktemp("imagenet")
    rng = np.random.default_rng(0)
    for split, n in PER_CLASS.items():
        for c in CLASSES:
            folder = root / split / c
            folder.mkdir(parents=True)
            for i in range(n):
                h, w = (48, 60) if (split, c, i) == ("val", CLASSES[0], 0) else rng.integers(20, 64, size=2)
                pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{c}_{i}.JPEG", quality=90)
    return root


def data_config(root, source=ImagenetFolderSource, **changes) -> DataConfig:
    """`changes`: fields of the source (image_shape, augment)."""
    fields = {"path": str(root), "image_shape": (S, S, 3), "augment": AugmentConfig(horizontal_flip=True)}
    return DataConfig(
        source=source(**{**fields, **changes}),
        train=InputConfig(batch_size=4, shuffle=False, input_random_seed=3, **ONE_HOST),
        eval=InputConfig(batch_size=4, shuffle=False, repeat=False, reset_for_eval=True, **ONE_HOST),
    )


def files(root, split: str) -> list:
    return sorted((root / split).glob("*/*.JPEG"), key=lambda p: (p.parent.name, p.name))


def decoded(path) -> np.ndarray:
    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


def reference_crop(pixels: np.ndarray, box: Box, flip: bool) -> np.ndarray:
    """The box sliced out with numpy, resized with Pillow's bicubic filter (unless already S x S),
    flipped with numpy, scaled to 0..1."""
    crop = pixels[box.top : box.top + box.height, box.left : box.left + box.width]
    if crop.shape[:2] != (S, S):
        crop = np.asarray(Image.fromarray(crop).resize((S, S), Image.Resampling.BICUBIC))
    return (crop[:, ::-1] if flip else crop).astype(np.float32) / 255


def read(inp, n: int) -> list[dict]:
    return [inp.get_next() for _ in range(n)]


def test_training_crops_are_the_drawn_boxes_resized_and_flipped(imagenet):
    """Unshuffled, one host: position k is image k % 24 in epoch k // 24; 7 batches reach epoch 1."""
    paths = files(imagenet, "train")
    rows = [
        (b["inputs"][j], b["labels"][j]) for b in read(build_input(data_config(imagenet), "train", TOKENIZER), 7)
        for j in range(4)
    ]  # fmt: skip
    flips = set()
    for k, (inputs, label) in enumerate(rows):
        index, epoch = k % len(paths), k // len(paths)
        pixels = decoded(paths[index])
        box, flip = train_draw(3, index, epoch, *pixels.shape[:2], S, True)
        flips.add(flip)
        np.testing.assert_allclose(inputs, reference_crop(pixels, box, flip), atol=1e-6, err_msg=f"position {k}")
        assert label == CLASSES.index(paths[index].parent.name)
    assert flips == {True, False}
    # epoch 1 draws again: the same image, another view
    assert not np.array_equal(rows[0][0], rows[24][0])


def test_eval_is_the_exact_central_box(imagenet):
    paths = files(imagenet, "val")
    batches = list(build_input(data_config(imagenet), "eval", TOKENIZER))
    rows = [b["inputs"][j] for b in batches for j in range(4)]
    assert len(batches) == 2 and [float(w) for w in batches[1]["weights"]] == [1, 1, 0, 0]
    first = decoded(paths[0])  # 48 x 60: side int(16 / 48 * 48) = 16, offset ((48-16+1)//2, (60-16+1)//2)
    assert central_box(48, 60, S) == Box(16, 22, 16, 16)
    np.testing.assert_array_equal(rows[0], first[16:32, 22:38].astype(np.float32) / 255)
    for path, row in zip(paths, rows):
        pixels = decoded(path)
        np.testing.assert_allclose(row, reference_crop(pixels, central_box(*pixels.shape[:2], S), False), atol=1e-6)
    assert not rows[-1].any()  # padding rows are zeros


def test_central_box_is_tfs_crop_padding_convention():
    # side = int(224 / 256 * min(H, W)); offset ((H - side + 1) // 2, (W - side + 1) // 2)
    assert central_box(375, 500, 224) == Box(24, 86, 328, 328)  # 328.125 -> 328
    assert central_box(256, 256, 224) == Box(16, 16, 224, 224)
    assert central_box(300, 257, 224) == Box(38, 17, 224, 224)  # 224.875 -> 224


def test_random_boxes_keep_inceptions_area_and_aspect_bounds():
    rng = np.random.default_rng(1)
    height, width = 375, 500
    boxes = [random_resized_box(height, width, 224, rng) for _ in range(3000)]
    area = np.array([b.height * b.width for b in boxes]) / (height * width)
    ratio = np.array([b.width / b.height for b in boxes])
    # each side is rounded to a pixel: at most half a pixel off each way
    assert area.min() >= AREA_RANGE[0] * 0.97 and area.max() <= 1
    assert ratio.min() >= ASPECT_RANGE[0] * 0.97 and ratio.max() <= ASPECT_RANGE[1] * 1.03
    assert all(b.top >= 0 and b.left >= 0 and b.top + b.height <= height and b.left + b.width <= width for b in boxes)
    # the whole ranges are drawn, not a corner of them
    assert area.min() < 0.1 and area.max() > 0.9 and ratio.min() < 0.8 and ratio.max() > 1.25
    # log-uniform: on a square image, as many portrait as landscape crops (a 500 x 375 one
    # favours landscape: tall crops of large area do not fit, and are drawn again)
    square = [random_resized_box(400, 400, 224, rng) for _ in range(3000)]
    assert abs(np.mean([math.log(b.width / b.height) for b in square])) < 0.02
    # a 1000 x 50 strip fits no box of area >= 8 % and aspect <= 4/3: 10 misses, then the central crop
    assert {random_resized_box(1000, 50, 224, rng) for _ in range(50)} == {central_box(1000, 50, 224)}
    flips = [train_draw(0, i, 0, height, width, 224, True)[1] for i in range(2000)]
    assert 0.45 < np.mean(flips) < 0.55
    assert not any(train_draw(0, i, 0, height, width, 224, False)[1] for i in range(100))


def digest(batches: list[dict]) -> list[str]:
    """One hash per real row (its inputs and label), for comparing rows regardless of order."""
    return [
        hashlib.sha256(b["inputs"][j].tobytes() + b["labels"][j].tobytes()).hexdigest()
        for b in batches for j in range(len(b["labels"])) if b["weights"][j] > 0
    ]  # fmt: skip


def test_hosts_read_disjoint_halves_with_the_same_views(imagenet):
    """Shuffled, two hosts: one epoch of both hosts is one epoch of one host, row for row (a
    view depends on (seed, image, epoch), not on the host)."""
    shuffled = data_config(imagenet).replace(train=InputConfig(batch_size=4, input_random_seed=5, **ONE_HOST))
    one = digest(read(build_input(shuffled, "train", TOKENIZER), 6))
    halves = [
        digest(read(build_input(shuffled, "train", TOKENIZER, num_infeed_hosts=2, infeed_host_index=i), 3))
        for i in (0, 1)
    ]
    assert not set(halves[0]) & set(halves[1])
    assert sorted(halves[0] + halves[1]) == sorted(one) and len(set(one)) == 24


def test_resume_from_the_iterator_state_is_exact(imagenet):
    data = data_config(imagenet).replace(train=InputConfig(batch_size=4, input_random_seed=9, **ONE_HOST))
    whole = read(build_input(data, "train", TOKENIZER), 9)
    first = build_input(data, "train", TOKENIZER)
    read(first, 5)
    resumed = build_input(data, "train", TOKENIZER)
    resumed.set_state(first.get_state())
    for a, b in zip(read(resumed, 4), whole[5:]):  # across the end of epoch 1 (6 batches)
        np.testing.assert_array_equal(a["inputs"], b["inputs"])
        np.testing.assert_array_equal(a["labels"], b["labels"])


def test_decoding_in_a_grain_worker_gives_the_same_batches(imagenet):
    data = data_config(imagenet)
    workers = data.replace(train=data.train.replace(num_workers=1))
    inp = build_input(workers, "train", TOKENIZER)
    try:
        assert digest(read(inp, 3)) == digest(read(build_input(data, "train", TOKENIZER), 3))
    finally:
        inp.close()


def test_array_record_shards_of_the_jpeg_bytes_read_as_the_files_do(imagenet, tmp_path):
    out = tmp_path / "ar"
    written = write_image_records(str(imagenet), str(out), num_shards=3, val_num_shards=2)
    assert [s["records"] for s in written["train"]["shards"]] == [8, 8, 8]
    assert written["train"]["classes"] == list(CLASSES) and written["val"]["num_records"] == 6
    again = tmp_path / "again"
    assert image_records_main(["--input", str(imagenet), "--output", str(again), "--num-shards", "3",
                               "--val-num-shards", "2"]) == 0  # fmt: skip
    for split in ("train", "val"):
        for shard in sorted((out / split).glob("*.array_record")):
            assert shard.read_bytes() == (again / split / shard.name).read_bytes()
    folder, records = data_config(imagenet), data_config(out, source=ImagenetArrayRecordSource)
    for split, n in (("train", 7), ("eval", 2)):
        assert digest(read(build_input(records, split, TOKENIZER), n)) == digest(
            read(build_input(folder, split, TOKENIZER), n)
        )
    shard = out / "train" / "shard-00001-of-00003.array_record"
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises((ConfigError, RuntimeError)):
        build_input(records, "train", TOKENIZER)


def test_bad_setups_are_one_error_naming_the_field(imagenet, tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"data.path is empty.*--data.source synthetic_images"):
        data_config("").validate()
    with pytest.raises(MissingFileError, match=r"data.path=.* has no train/ folder"):
        data_config(tmp_path).validate()
    with pytest.raises(ConfigError, match=r"data.image_shape=\(16, 12, 3\).*square"):
        data_config(imagenet, image_shape=(16, 12, 3)).validate()
    with pytest.raises(ConfigError, match=r"data.image_shape is empty"):
        data_config(imagenet, image_shape=()).validate()
    with pytest.raises(ConfigError, match=r"data.augment.crop_padding=4 would do nothing"):
        data_config(imagenet, augment=AugmentConfig(crop_padding=4)).validate()
    no_val = tmp_path / "no_val"
    (no_val / "train" / "a").mkdir(parents=True)
    (no_val / "train" / "a" / "x.JPEG").write_bytes(b"not a jpeg")
    data = data_config(no_val)
    data.validate()  # the train split is there; the eval split is checked when it is built
    with pytest.raises(MissingFileError, match=r"no val/ folder for the eval split"):
        build_input(data, "eval", TOKENIZER)
    with pytest.raises(ConfigError, match=r"x.JPEG' is not a readable image"):
        build_input(data, "train", TOKENIZER).get_next()
    (no_val / "val" / "b").mkdir(parents=True)
    (no_val / "val" / "b" / "y.JPEG").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"val/ has class folder\(s\) \['b'\] that train/ lacks"):
        build_input(data, "eval", TOKENIZER)
    assert image_records_main(["--input", str(tmp_path / "none"), "--output", str(tmp_path / "out")]) == 2
    assert "error: --input=" in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert image_records_main(["--input", str(imagenet), "--output", str(tmp_path / "out"), "--num-shards", "0"]) == 2
    assert "--num-shards 0" in capsys.readouterr().err
    assert image_records_main(["--input", str(no_val), "--output", str(tmp_path / "bad")]) == 2
    assert "x.JPEG' is not a readable image" in capsys.readouterr().err
    assert not list((tmp_path / "bad").rglob("*.tmp")) and not list((tmp_path / "bad").rglob("*.array_record"))
    with pytest.raises(MissingFileError, match=r"has no images.json"):
        data_config(imagenet, source=ImagenetArrayRecordSource).validate()


def test_every_data_flag_of_imagenet_resnet50_takes_effect_or_is_refused(imagenet):
    """The experiment's data section, on the tiny tree, through the same walk as every other
    experiment's (tests/test_every_run_flag_takes_effect.py)."""
    from test_every_run_flag_takes_effect import NO_EFFECT_HERE, _section_paths, check_takes_effect

    from experiments import registry

    exp = registry.load_experiment("imagenet_resnet50")
    assert exp.data.source.kind == "imagenet_folder"
    for path, value in {
        "data.source.path": str(imagenet),
        "data.source.image_shape": (S, S, 3),
        "model.input_shape": (S, S, 3),
        "data.train.batch_size": 2,
        "data.eval.batch_size": 2,
    }.items():
        exp = exp.override(path, value)
    # data.source: another source given this tree is refused naming data.path (an .npz file or a
    # corpus was expected), rightly, but not naming data.source, as the walk asks; each source has its tests.
    walked = [p for p in _section_paths(exp, "data") if p not in NO_EFFECT_HERE and p != "data.source"]
    outcomes = [check_takes_effect(exp, p) for p in walked]
    assert any("augment.horizontal_flip" in o and "took effect" in o for o in outcomes)
    assert any("augment.crop_padding" in o and "refused" in o for o in outcomes)
