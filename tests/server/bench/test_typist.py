"""The typist (typist.py): what one Tab takes, what is on screen when a key is due, the summary."""

import asyncio
import types
from pathlib import Path

from memosight.server.bench.typing_system import SystemStats
from memosight.server.bench.typist import Typed, summarize, taken, type_function


def test_one_tab_takes_the_whole_suggestion_or_else_its_first_line_when_that_comes_next():
    assert taken("return x\n", "return x\nfoo") == "return x\n"
    assert taken("return x\n    y = 1", "return x\n    z = 2") == "return x"
    assert taken("return y", "return x") == ""
    assert taken("\n    x", "\n    y") == ""  # an empty first line is nothing to take
    assert taken("", "abc") == ""


class Oracle:
    """Shows the next `n` characters still to type once `delay_keys` edits have passed since the
    last Tab: a system that is always right, after a while."""

    name = "oracle"

    def __init__(self, body: str, n: int, delay_keys: int):
        self.body, self.n, self.delay_keys = body, n, delay_keys
        self.edits: list[tuple[str, bool]] = []
        self.text, self.cursor, self.start, self.since = "", 0, 0, 0

    async def open(self, path, text, cursor):
        self.text, self.cursor, self.start = text, cursor, cursor

    async def edit(self, text, cursor, inserted, accepted):
        self.edits.append((inserted, accepted))
        self.text, self.cursor = text, cursor
        self.since = 0 if accepted else self.since + 1

    def visible(self):
        if self.since < self.delay_keys:
            return ""
        typed = self.cursor - self.start
        return self.body[typed:typed + self.n]

    async def close(self, path):
        pass


def test_the_typist_takes_what_is_on_screen_when_a_key_is_due_and_types_the_rest():
    body = "def f(x):\n    return x + 1\n"
    text = "import os\n" + body + "print(f(1))\n"
    start = text.index("def")
    system = Oracle(body, n=5, delay_keys=2)
    typed = Typed()
    args = types.SimpleNamespace(key_ms=0.0, newline_ms=0.0, read_ms=0.0)
    asyncio.run(type_function(system, Path("a.py"), text, start, start + len(body), args, typed))
    assert system.text == text  # the buffer ends as the file was
    typed_chars = sum(len(piece) for piece, accepted in system.edits if not accepted)
    assert typed.saved + typed_chars == len(body) == typed.chars
    assert typed.saved == sum(typed.acceptances) and all(0 < n <= 5 for n in typed.acceptances)
    assert typed.keys == len(system.edits) and typed.visible >= len(typed.acceptances) > 0
    # two keys typed after each Tab before the next suggestion shows
    pattern = [accepted for _, accepted in system.edits]
    assert pattern[:3] == [False, False, True]


def test_a_suggestion_never_on_screen_in_time_saves_nothing():
    body = "x = compute(1, 2)\n"
    typed = Typed()
    args = types.SimpleNamespace(key_ms=0.0, newline_ms=0.0, read_ms=0.0)
    system = Oracle(body, n=5, delay_keys=10**6)
    asyncio.run(type_function(system, Path("a.py"), body, 0, len(body), args, typed))
    assert typed.saved == 0 and typed.visible == 0 and typed.keys == len(body)


def test_the_summary_gives_shares_and_cost_per_saved_character():
    typed = Typed(chars=200, keys=150, due=150, visible=40, saved=60, acceptances=[20, 40])
    stats = SystemStats(requests=30, latencies_ms=[10.0, 20.0, 30.0, 400.0], model_cpu_s=12.0)
    r = summarize("memosight", typed, stats)
    assert r["chars_saved_share"] == 0.3 and r["mean_acceptance_chars"] == 30.0
    assert r["latency_ms"] == {"p50": 30.0, "p95": 400.0, "shown": 4}
    assert r["model_cpu_s_per_saved_char"] == 0.2
