"""Streaming load: reading a ~0.7 GB checkpoint into its sharding (one CPU device, whose buffers
are host memory) holds the parameters plus less than the checkpoint's largest tensor: never a
second copy of the model. Peak resident memory (VmHWM) of a child process, against a child that loads the tiny
fixture (the runtime's own fixed overhead). benchmarks/hf_import_memory.py prints the same for
larger models and for the whole import."""

from benchmarks.hf_import_memory import _LOAD, FIXTURE, peak_rss, write_checkpoint

MIB = 2**20


def test_streaming_load_holds_the_parameters_and_at_most_one_more_tensor(tmp_path):
    sizes = write_checkpoint(tmp_path / "src", layers=1)
    assert sizes["params"] > 600 * MIB
    baseline = peak_rss(FIXTURE, tmp_path / "tiny", "sgd", _LOAD)
    peak = peak_rss(tmp_path / "src", tmp_path / "job", "sgd", _LOAD)
    extra = peak - baseline - sizes["params"]
    # one tensor read and converted at a time; 64 MiB for the allocator's slack
    assert extra <= sizes["largest"] + 64 * MIB, (
        f"peak {peak / MIB:.0f} MiB = baseline {baseline / MIB:.0f} + params {sizes['params'] / MIB:.0f} + "
        f"{extra / MIB:.0f} MiB, more than the largest tensor ({sizes['largest'] / MIB:.0f} MiB)"
    )
