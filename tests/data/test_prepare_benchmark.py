"""benchmarks.input, shrunk: it prepares, loads gpt3_xl's input and prints its table and numbers."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("apache_beam", reason="the [prepare] extra (.ci/run installs it)")


def test_input_benchmark_prints_its_table_and_the_cores_per_host(capsys):
    from benchmarks import input as bench

    assert (
        bench.main(
            [
                "--docs",
                "300",
                "--seconds",
                "0.5",
                "--workers",
                "0",
                "--beam-workers",
                "1",
                "--vocab-size",
                "500",
                "--images",
                "8",
            ]  # fmt: skip
        )
        == 0
    )
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])
    (load,) = result["loading"]
    assert load["batch_shape"] == [16, 2048] and load["tokens_per_s"] > 0
    assert result["preparation"][0]["documents"] == 300
    need = result["gpt3_xl"]
    assert need["params"] == 1_315_819_520  # GPT-3 XL with V = 50304 (benchmarks/flops.py's module doc)
    # 55.2% of 989.4 TF/s over PaLM's 6N + 12 L d S FLOPs per token, times 8 GPUs
    per_token = 6 * 1_315_819_520 + 12 * 24 * 2048 * 2048
    assert need["tokens_per_s_per_host"] == pytest.approx(8 * 0.552 * 989.4e12 / per_token)
    assert result["cores_per_host"] == -(-need["tokens_per_s_per_host"] // load["tokens_per_s"])
    assert "Cores per host so the loader is never the bottleneck" in out
    images = result["images"]  # imagenet_resnet50's input on 8 JPEGs; ResNet-50's 5,538 images/s per H100 x 8
    (image_load,) = images["loading"]
    assert image_load["batch_shape"] == [64, 224, 224, 3] and image_load["images_per_s"] > 0
    assert images["images_per_s_per_host"] == 8 * 5538
    assert images["cores_per_host"] == -(-images["images_per_s_per_host"] // image_load["images_per_s"])
