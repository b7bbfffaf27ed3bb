"""Where a keystroke's prefill comes from. The engine keeps the KV cache of the last prompt it ran
and prefills from where the new one first differs: what the user typed (and the text after the
cursor, which the FIM prompt puts behind it) costs that, but the packed context moving above the
cursor's line costs everything below the move. A request or warm-up is named by the worst move
since the document's last request: `typed` (from the last prompt's cursor line on), `context`
(above it: a far part re-chosen, the near prefix re-started, the cursor moved away), or `new` (another
document, or the first prompt). `bench replay` reports the tokens prefilled per keystroke by cause.
"""

from __future__ import annotations

from os.path import commonprefix

CAUSES = ("typed", "context", "new")  # from the cheapest move to the dearest


class PromptMoves:
    """The engine thread's record of the prefixes it ran (one engine, one KV cache)."""

    def __init__(self):
        self._last: tuple[str, str] | None = None  # (uri, prompt prefix) of the last request or warm-up
        self._ahead: dict[str, tuple[int, str]] = {}  # uri -> (tokens warm-ups prefilled, worst cause)

    def move(self, uri: str, prefix: str) -> str:
        """How `prefix` moved from the last prompt the engine ran; it is now the last."""
        last, self._last = self._last, (uri, prefix)
        if last is None or last[0] != uri:
            return "new"
        old = last[1]
        # the previous prompt's cursor line and the one above it: typing, a newline, a backspace over one
        cursor_lines = old.rfind("\n", 0, max(0, old.rfind("\n"))) + 1
        return "typed" if len(commonprefix([old, prefix])) >= cursor_lines else "context"

    def warmed(self, uri: str, cause: str, tokens: int) -> None:
        """A warm-up prefilled `tokens` for the document's next request."""
        done, worst = self._ahead.get(uri, (0, "typed"))
        self._ahead[uri] = (done + tokens, max(worst, cause, key=CAUSES.index))

    def for_request(self, uri: str, cause: str) -> tuple[int, str]:
        """What warm-ups prefilled for this request, and the worst move since the last request."""
        done, worst = self._ahead.pop(uri, (0, "typed"))
        return done, max(worst, cause, key=CAUSES.index)
