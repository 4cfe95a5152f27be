"""Test-wide setup: 8 fake CPU devices (set before JAX starts), small and deterministic.

One persistent JAX compilation cache per test run, shared by the xdist workers (made by the
first process, xdist's controller, which outlives the workers and removes it at exit): many
tests compile the same tiny train step again (a resumed run, the same tiny experiment in
another module, on the other worker), and the second compile of an identical program is read
back instead of recompiled. It is the same executable, so no result changes. An entry read
while another worker writes it fails to load with a warning and is compiled instead, as jax
handles any unreadable entry. It is set through jax.config, not the environment, so the CLI
subprocesses that tests start compile as a user's do.
PAX_EQX_TESTS_NO_COMPILATION_CACHE=1 turns it off (to time or debug the compiles themselves).
The host allocator keeps freed pages for the next step, as every pax_eqx program's does
(pax_eqx/command_line/host_memory.py).
"""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# A run with --train.trackers wandb (the flag walk's tiny runs) keeps its W&B run on disk: no test
# reaches W&B's servers, and none needs a login.
os.environ.setdefault("WANDB_MODE", "offline")


import jax  # noqa: E402
import pytest  # noqa: E402

from pax_eqx.command_line.host_memory import retain_freed_pages  # noqa: E402

retain_freed_pages()

if not os.environ.get("PAX_EQX_TESTS_NO_COMPILATION_CACHE"):
    _COMPILATION_CACHE = os.environ.get("PAX_EQX_TESTS_SHARED_JAX_CACHE")
    if _COMPILATION_CACHE is None:  # the first process of the run (xdist's controller): it outlives the workers
        _COMPILATION_CACHE = tempfile.mkdtemp(prefix="pax_eqx_tests_jax_cache_")
        os.environ["PAX_EQX_TESTS_SHARED_JAX_CACHE"] = _COMPILATION_CACHE
        atexit.register(shutil.rmtree, _COMPILATION_CACHE, ignore_errors=True)
    jax.config.update("jax_compilation_cache_dir", _COMPILATION_CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture
def entry_hooks_restored(monkeypatch):
    """For tests that call a program's `entry.run` in this process: it sets process-wide hooks
    (the warning format, the unraisable hook, log filters on absl and asyncio); they are put back
    after the test, and PAX_EQX_VERBOSE / PAX_EQX_TRACEBACK are unset during it."""
    import logging
    import sys
    import warnings

    from pax_eqx.command_line import entry

    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    for name in entry.VERBOSE_ENV:
        monkeypatch.delenv(name, raising=False)
    yield
    for library in ("absl", "asyncio"):
        logging.getLogger(library).removeFilter(entry._drop_traceback)


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
