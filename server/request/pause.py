"""The user paused: no edit for a while. One thread waits for it, however fast the edits come."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class PauseWatcher:
    """Calls `on_pause()` (on its own thread) once `after_s` seconds pass without `edited()`."""

    def __init__(self, after_s: float, on_pause: Callable[[], None]):
        self.after_s = after_s
        self._on_pause = on_pause
        self._due: float | None = None
        self._closed = False
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def edited(self) -> None:
        with self._wake:
            if self._closed:
                return
            self._due = time.monotonic() + self.after_s
            if self._thread is None:  # started with the first edit: a command that never edits has none
                self._thread = threading.Thread(target=self._wait, name="memosight-pause", daemon=True)
                self._thread.start()
            self._wake.notify()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()

    def _wait(self) -> None:
        with self._wake:
            while not self._closed:
                if self._due is None:
                    self._wake.wait()
                    continue
                left = self._due - time.monotonic()
                if left > 0:
                    self._wake.wait(left)
                    continue
                self._due = None
                self._wake.release()
                try:
                    self._on_pause()
                except Exception:  # noqa: BLE001 - one failed call must not end the watching
                    log.exception("the pause's work failed")
                finally:
                    self._wake.acquire()
