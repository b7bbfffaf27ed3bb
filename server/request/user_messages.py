"""What the user is told about the engine, and when: a failing backend at once (from the engine
thread, through the `say` the server gives it), other failures with the next answer, each kind once
an hour, so that a server that is down is one message and not one per keystroke."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

HOUR_S = 3600.0


class UserMessages:
    def __init__(self, say: Callable[[str], bool] | None = None) -> None:
        self.waiting: deque[str] = deque(maxlen=32)  # to go out with the next answer (filled on any thread)
        # shows a message now, from any thread; False when it cannot yet (no client): it waits then
        self.say = say
        self.notices: dict[str, dict] = {}  # the engine's notices by kind (a handful of kinds): for status
        self._said: dict[str, float] = {}  # kind -> when it was last said, in the order they were said

    def notice(self, kind: str, message: str) -> None:
        """The engine cannot serve as configured (engine thread): said at once, once per kind an
        hour; kept for memosight/status."""
        seen = self.notices.get(kind, {"count": 0})
        self.notices[kind] = {"message": message, "count": seen["count"] + 1, "at": time.time()}
        if not self.first_this_hour(kind):
            return
        if self.say is None or not self.say(message):
            self.waiting.append(message)

    def failure(self, kind: str, message: str) -> None:
        """A request failed: said with its answer, once per kind an hour."""
        if self.first_this_hour(kind):
            self.waiting.append(message)

    def take(self) -> list[str]:
        """The messages waiting for an answer to carry them."""
        out = []
        while self.waiting:
            out.append(self.waiting.popleft())
        return out

    def first_this_hour(self, kind: str) -> bool:
        now = time.monotonic()
        if now - self._said.get(kind, -HOUR_S) < HOUR_S:
            return False
        self._said.pop(kind, None)  # re-inserted below: the dict stays in the order they were said
        if len(self._said) >= 256:  # failures of ever new text: the oldest goes
            self._said.pop(next(iter(self._said)))
        self._said[kind] = now
        return True
