"""The heap trimmer: it trims only after work, off the caller's thread, and stops with the engine."""

import sys
import time

import pytest
from memosight.engine.loading.memory import HeapTrimmer


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_the_heap_is_trimmed_after_work_and_not_while_idle():
    trimmer = HeapTrimmer(every_s=0.05)
    time.sleep(0.2)
    assert trimmer.trims == 0  # nothing happened: nothing to give back
    trimmer.touch()
    deadline = time.monotonic() + 5
    while trimmer.trims == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert trimmer.trims == 1
    trimmer.close()
    trimmer.touch()
    time.sleep(0.2)
    assert trimmer.trims == 1  # closed: the thread is gone
