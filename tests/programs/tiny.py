"""Command-line overrides that shrink shakespeare_char to a few seconds of CPU."""

TINY = [
    "--model.num-layers", "1", "--model.model-dims", "32", "--model.hidden-dims", "64", "--model.num-heads", "2",
    "--data.seq-len", "16", "--data.eval.eval-loop-num-batches", "2",
    "--train.num-steps", "6", "--train.summary-interval-steps", "2", "--train.eval-interval-steps", "3",
    "--checkpoint.every-n-steps", "3", "--decode.max-new-tokens", "12",
    "--train.steps-per-loop", "1",  # with events every 2-3 steps, a 10-step loop would only add a compile
]  # fmt: skip


def mesh_args(num_devices: int) -> list[str]:
    """Data parallel over every device, with a batch that splits over them."""
    batch = str(max(4, num_devices))
    return ["--mesh.ici-mesh-shape", str(num_devices), "1", "1",
            "--data.train.batch-size", batch, "--data.eval.batch-size", batch]  # fmt: skip


def tiny_args(job_dir, *extra: str, num_devices: int | None = None) -> list[str]:
    if num_devices is None:
        import jax

        num_devices = jax.device_count()
    return ["--exp", "shakespeare_char", "--job-log-dir", str(job_dir), *TINY, *mesh_args(num_devices), *extra]
