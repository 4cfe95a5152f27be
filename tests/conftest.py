"""Test-wide setup: 8 fake CPU devices (set before JAX starts), small and deterministic."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


import pytest  # noqa: E402


@pytest.fixture
def cudnn_tracing(monkeypatch):
    """Lets `jax.nn.dot_product_attention(implementation="cudnn")` be *traced* on a CPU: jax
    checks for cuDNN and the GPU's compute capability while tracing, before anything is
    compiled. Only jaxprs can be made under it (nothing lowers: there is no cuDNN).

    Yields a function counting how often cuDNN's attention forward kernel runs in a jaxpr,
    the question remat policies answer."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn

    monkeypatch.setattr(cudnn, "check_cudnn_version", lambda: 91000)
    monkeypatch.setattr(cudnn, "check_compute_capability", lambda capability: True)
    return lambda jaxpr: str(jaxpr).count("dot_product_attention_fwd_wrapper[")
