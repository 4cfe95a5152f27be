"""Reading a damaged checkpoint leaves orbax/tensorstore futures whose exceptions nobody awaits;
asyncio logs them when they are garbage collected ("Future exception was never retrieved"). That
is orbax's noise, not a failure: every checkpoint test module runs with asyncio's log quiet."""

import gc
import logging

import pytest


@pytest.fixture(autouse=True, scope="module")
def _quiet_asyncio():
    asyncio_log = logging.getLogger("asyncio")
    level = asyncio_log.level
    asyncio_log.setLevel(logging.CRITICAL)
    yield
    gc.collect()
    asyncio_log.setLevel(level)
