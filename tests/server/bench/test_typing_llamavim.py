"""llama.vim's request logic (typing_llamavim.py) against a fake /infill that records what it is sent,
then once against a real llama-server."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from memosight.server.bench.llamavim_ring import chunk_sim
from memosight.server.bench.typing_llamavim import LlamaVimSystem

BUFFER = "def add(a, b):\n    return \n\nx = 1\n"
START = BUFFER.index("\n\n")  # the end of "    return "


class FakeLlama:
    """A /infill that records each body and answers `reply(body)` (compact JSON, as llama-server)
    after `delay(body)` seconds."""

    def __init__(self):
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.reply = lambda body: ""
        self.delay = lambda body: 0.0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.bodies.append(body)
                fake.headers.append(dict(self.headers))
                time.sleep(fake.delay(body))
                answer = {} if body["n_predict"] == 0 else {"content": fake.reply(body), "tokens_cached": 0}
                data = json.dumps(answer, separators=(",", ":")).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def fims(self) -> list[dict]:
        return [b for b in self.bodies if b["n_predict"] != 0]


@pytest.fixture(scope="module")
def fake_server():
    fake = FakeLlama()
    yield fake
    fake.server.shutdown()


@pytest.fixture
def fake(fake_server):
    fake_server.bodies.clear()
    fake_server.headers.clear()
    fake_server.reply = lambda body: ""
    fake_server.delay = lambda body: 0.0
    return fake_server


async def until(condition, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def typed(system: LlamaVimSystem, text: str, cursor: int, keys: str) -> tuple[str, int]:
    """Type `keys` at `cursor` one at a time (no pause); returns the text and cursor after."""
    for key in keys:
        text, cursor = text[:cursor] + key + text[cursor:], cursor + 1
        await system.edit(text, cursor, key, False)
    return text, cursor


async def started(url: str, **config) -> LlamaVimSystem:
    system = LlamaVimSystem(url, config=config or None, seed=0)
    await system.start()
    return system


async def test_an_edit_sends_llama_vims_infill_body_and_shows_the_answer(fake):
    fake.reply = lambda body: " b"
    system = await started(fake.url)
    await system.open("/nonexistent/add.py", BUFFER, START)
    text, cursor = await typed(system, BUFFER, START, "a")
    await until(lambda: system.visible())
    body = fake.fims()[0]
    assert body["input_prefix"] == "def add(a, b):\n"
    assert body["prompt"] == "    return a"
    assert body["input_suffix"] == "\n\nx = 1\n"  # the rest of the line, then the lines below
    assert body["input_extra"] == []
    assert body["n_indent"] == 4 and body["id_slot"] == 0 and body["model"] == ""
    assert body["n_predict"] == 128 and body["t_max_prompt_ms"] == 500 and body["t_max_predict_ms"] == 250
    assert (body["top_k"], body["top_p"], body["samplers"]) == (40, 0.9, ["top_k", "top_p", "infill"])
    assert body["stream"] is False and body["cache_prompt"] is True and body["stop"] == []
    assert "content" in body["response_fields"] and "seed" not in body and "temperature" not in body
    assert fake.headers[0]["Authorization"].startswith("Bearer")
    assert system.visible() == " b"
    stats = await system.stop()
    assert len(stats.latencies_ms) == 1 and stats.requests >= 1


async def test_a_hint_shown_is_prefetched_as_if_accepted_and_tab_shows_the_prefetch_at_once(fake):
    fake.reply = lambda body: " b" if body["prompt"] == "    return a" else "\n\ndef sub(a, b):"
    system = await started(fake.url)
    await system.open("/nonexistent/add.py", BUFFER, START)
    text, cursor = await typed(system, BUFFER, START, "a")
    await until(lambda: len(fake.fims()) == 2 and system.count["responses_cached_only"] == 1)
    prefetch = fake.fims()[1]
    assert prefetch["prompt"] == "    return a b" and prefetch["input_suffix"] == "\n\nx = 1\n"
    assert prefetch["input_prefix"] == "def add(a, b):\n" and prefetch["t_max_predict_ms"] == 1000
    assert system.visible() == " b"  # the prefetch went to the cache only
    shown = system.visible()
    text, cursor = text[:cursor] + shown + text[cursor:], cursor + len(shown)
    await system.edit(text, cursor, shown, True)
    assert system.visible() == "\n\ndef sub(a, b):"  # from the cache, before any request
    stats = await system.stop()
    assert stats.latencies_ms[-1] < 50
    assert stats.notes["prefetch"] >= 1 and stats.notes["cache_hits_exact"] >= 1


async def test_typing_into_a_cached_completion_shows_the_rest_without_asking(fake):
    fake.reply = lambda body: " + b  # sum" if body["prompt"] == "    return a" else ""
    system = await started(fake.url)
    await system.open("/nonexistent/add.py", BUFFER, START)
    text, cursor = await typed(system, BUFFER, START, "a")
    await until(lambda: len(fake.fims()) == 2 and system.job is None)  # the answer, then its prefetch
    fake.delay = lambda body: 0.5  # anything asked from now on comes too late for the assertions below
    answers = system.count["responses"]
    text, cursor = await typed(system, text, cursor, " +")
    assert system.visible() == " b  # sum"  # the look-back: 2 characters typed into the cached answer
    assert system.count["responses"] == answers
    text, cursor = await typed(system, text, cursor, " c")  # no longer what it said
    assert system.visible() == ""
    stats = await system.stop()
    assert stats.notes["cache_hits_lookback"] >= 2


async def test_one_request_in_flight_then_one_retry_for_where_the_cursor_is_now(fake):
    answer_first = threading.Event()  # the first answer is held until the keys after it are typed
    fake.delay = lambda body: answer_first.wait(10) and 0.0 if body["prompt"].endswith("1") else 0.0
    fake.reply = lambda body: "QQQ" if body["prompt"].endswith("1") else ""
    system = await started(fake.url)
    await system.open("/nonexistent/add.py", BUFFER, START)
    text, cursor = await typed(system, BUFFER, START, "1")
    await until(lambda: len(fake.bodies) == 1)
    text, cursor = await typed(system, text, cursor, "2")
    await asyncio.sleep(0.15)
    text, cursor = await typed(system, text, cursor, "3")
    await asyncio.sleep(0.15)
    assert len(fake.bodies) == 1  # the first is still running: the others wait
    answer_first.set()
    await until(lambda: len(fake.fims()) >= 2)
    prompts = [b["prompt"] for b in fake.fims()]
    assert prompts[:2] == ["    return 1", "    return 123"]
    assert not any(p.endswith("12") for p in prompts)
    # the first answer came for "a1" while the cursor was after "a123": cached, never shown
    await until(lambda: system.count["responses"] >= 2)
    assert "QQQ" not in system.visible()
    stats = await system.stop()
    assert stats.notes["responses_not_shown"] >= 1 and stats.notes["retries_armed"] >= 2


async def test_no_automatic_request_with_a_long_text_after_the_cursor(fake):
    system = await started(fake.url)
    await system.open("/nonexistent/add.py", BUFFER, 3)
    await typed(system, BUFFER, 3, "x")  # "defx| add(a, b):": 10 characters after the cursor
    await asyncio.sleep(0.1)
    assert fake.bodies == [] and system.count["skipped_line_suffix"] == 1
    await system.stop()


async def test_a_chunk_picked_on_buffer_enter_joins_the_ring_when_the_user_pauses(fake, tmp_path):
    other = tmp_path / "other.py"
    other_text = "class Store:\n    items = []\n    def put(self, item):\n        self.items.append(item)\n"
    other.write_text(other_text)
    system = await started(fake.url, ring_update_ms=50)
    system.RING_IDLE_S = 2.0  # llama.vim's 3 s, shortened for the test; long after BufEnter's pick
    await system.open(str(other), other_text, 0)
    await asyncio.sleep(0.2)  # BufEnter's pick, 100 ms after (the buffer is still unmodified)
    assert len(system.ring_queued) == 1 and not [b for b in fake.bodies if b["n_predict"] == 0]
    await until(lambda: [b for b in fake.bodies if b["n_predict"] == 0], timeout=6)
    ring = [b for b in fake.bodies if b["n_predict"] == 0][0]
    assert ring["input_extra"][0]["text"] == other_text and ring["input_extra"][0]["filename"] == str(other)
    assert (ring["prompt"], ring["input_prefix"], ring["input_suffix"], ring["samplers"]) == ("", "", "", [])
    assert ring["t_max_predict_ms"] == 1 and ring["temperature"] == 0.0
    await system.close(str(other))
    await system.open("/nonexistent/add.py", BUFFER, START)
    await typed(system, BUFFER, START, "1")
    await until(lambda: fake.fims())
    assert [c["text"] for c in fake.fims()[0]["input_extra"]] == [other_text]
    stats = await system.stop()
    assert stats.notes["ring_update"] == 1 and stats.requests == len(fake.bodies)


async def test_a_modified_buffer_gives_no_chunk_on_leave(fake, tmp_path):
    other = tmp_path / "other.py"
    other.write_text("a = 1\nb = 2\nc = 3\n")
    system = await started(fake.url, ring_n_chunks=4)
    await system.open(str(other), "a = 1\nb = 2\nc = 3\n", 0)
    await typed(system, "a = 1\nb = 2\nc = 3\n", 0, "#")  # before BufEnter's timer fires
    await system.close(str(other))
    await asyncio.sleep(0.15)
    assert system.ring_queued == [] and system.ring_chunks == []
    await system.stop()


def test_the_cache_forgets_the_least_recently_used_and_chunk_similarity():
    system = LlamaVimSystem("http://127.0.0.1:1", config={"max_cache_keys": 2})
    system._cache_insert("a", "1")
    system._cache_insert("b", "2")
    assert system._cache_get("a") == "1"
    system._cache_insert("c", "3")  # "b" was used least recently
    assert list(system.cache) == ["a", "c"]
    assert chunk_sim(["x = foo(bar)"], ["x = foo(bar)"]) == 1.0
    assert chunk_sim(["alpha beta"], ["gamma delta"]) == 0.0
    assert chunk_sim([], []) == 1.0


async def test_types_into_a_real_llama_server_and_sees_a_hint(llama_cpp_server):
    url, log_path = llama_cpp_server
    system = await started(url)
    text = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fib\n"
    cursor = text.index("fib\n") + 3
    await system.open("/nonexistent/fib.py", text, cursor)
    seen = ""
    for key in "onacci(n - 1) + fibonacci(n - 2)":
        text, cursor = await typed(system, text, cursor, key)
        for _ in range(40):
            await asyncio.sleep(0.025)
            seen = seen or system.visible()
        if seen:
            break
    stats = await system.stop()
    assert seen, (stats.notes, log_path.read_text()[-2000:])
    assert stats.requests >= 1 and stats.notes["responses_invalid"] == 0
