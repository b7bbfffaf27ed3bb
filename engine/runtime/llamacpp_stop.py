"""Stopping a llama.cpp decode part way, when its request is cancelled.

llama.cpp asks an abort callback after every node of a decode (~600 a pass for Qwen2.5-Coder-0.5B).
A Python callback would take the GIL each time; this one is libc's strlen on a two-byte buffer
([flag, 0]): it returns 1 or 0, and a bool is read from the return register's low byte (x86-64,
AArch64), so it costs nothing and the flag is set from Python. While a prefill runs, a watcher
thread raises the flag when the request's cancel event is set; the decode then returns 2 and its
batch's cells are dropped by llama.cpp (the runtime keeps what earlier batches computed).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import threading
import time

stopping = False  # a flag is up: the errors llama.cpp logs for the stopped decode are expected


def _byte_test():
    """The address of a C function that says whether the byte at its argument is not zero."""
    for name in (None, ctypes.util.find_library("c"), "msvcrt"):
        try:
            return ctypes.cast(ctypes.CDLL(name).strlen, ctypes.c_void_p).value
        except (OSError, AttributeError, TypeError):
            continue
    return None


class DecodeStop:
    """One context's abort callback and its flag."""

    def __init__(self, L, ctx):
        self._flag = ctypes.create_string_buffer(2)
        test = _byte_test()
        self.available = test is not None
        if self.available:
            self._callback = L.ggml_abort_callback(test)  # kept: llama.cpp holds the pointer
            L.llama_set_abort_callback(ctx, self._callback, ctypes.cast(self._flag, ctypes.c_void_p))

    @property
    def raised(self) -> bool:
        return bool(self._flag.raw[0])

    @contextlib.contextmanager
    def watching(self, cancel, within_s: float | None = None):
        """While the block runs, the flag goes up as soon as `cancel` is set (checked every 2 ms);
        with `within_s`, only that long after the block starts (then it runs to its end)."""
        global stopping
        if cancel is None or not self.available:
            yield
            return
        done = threading.Event()
        until = None if within_s is None else time.monotonic() + within_s

        def watch():
            global stopping
            while not done.wait(0.002):
                if until is not None and time.monotonic() > until:
                    return
                if cancel.is_set():
                    stopping = True
                    self._flag[0] = 1
                    return

        watcher = threading.Thread(target=watch, name="memosight-llamacpp-stop", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()
            self._flag[0] = 0
            stopping = False
