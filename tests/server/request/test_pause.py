"""A pause is noticed once the edits stop, however fast they came."""

from __future__ import annotations

import threading
import time

from memosight.server.request.pause import PauseWatcher


def test_a_pause_is_called_once_after_the_last_of_many_edits():
    paused = []
    done = threading.Event()
    watcher = PauseWatcher(0.05, lambda: (paused.append(time.monotonic()), done.set()))
    last = None
    for _ in range(200):  # a fuzzing client's rate: one thread waits, none is started per edit
        watcher.edited()
        last = time.monotonic()
    assert done.wait(5)
    time.sleep(0.15)
    assert len(paused) == 1 and paused[0] - last >= 0.05
    watcher.edited()  # the next pause is called again
    time.sleep(0.3)
    assert len(paused) == 2
    watcher.close()


def test_a_closed_watcher_calls_nothing():
    paused = []
    watcher = PauseWatcher(0.01, lambda: paused.append(1))
    watcher.close()
    watcher.edited()
    time.sleep(0.05)
    assert paused == []
