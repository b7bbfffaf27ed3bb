import itertools
import json
import random

from memosight.server.bench.fuzz_stream import (
    ACCEPTED_FLOOD,
    COMPLETION,
    INLINE,
    LONG_LINE_CHARS,
    NON_ASCII_URI,
    SCRATCH,
    SMALL_CHARS,
    FuzzStream,
    QuickText,
    heavy_text,
)
from memosight.server.bench.lsp_text import LspText
from memosight.server.documents import MAX_DOCUMENT_BYTES, Document, Position

NOISE = {"wrong_shape", "not_json", "junk_between_frames", "header_noise", "short_length"}
DOCUMENT_METHODS = {"textDocument/didOpen", "textDocument/didChange", "textDocument/didClose"}


def bodies(message) -> list[dict]:
    """The JSON bodies in a message's bytes that parse (framing noise and broken bodies skipped)."""
    out, data = [], message.data
    while b"Content-Length: " in data:
        _, _, data = data.partition(b"Content-Length: ")
        length, _, data = data.partition(b"\r\n\r\n")
        body, data = data[:int(length)], data[int(length):]
        try:
            out.append(json.loads(body))
        except (ValueError, RecursionError):
            pass
    return out


class Replay:
    """A server's documents (documents.py) with the stream's opens, edits and closes applied."""

    def __init__(self):
        self.docs: dict[str, Document] = {}
        self.versions: dict[str, int] = {}

    def apply(self, body: dict) -> None:
        params, method = body["params"], body["method"]
        uri = params["textDocument"]["uri"]
        if method == "textDocument/didOpen":
            self.docs[uri] = Document(uri, params["textDocument"]["text"], "python")
            self.versions[uri] = params["textDocument"]["version"]
        elif method == "textDocument/didClose":
            del self.docs[uri], self.versions[uri]
        else:
            for change in params["contentChanges"]:
                start, end = (change["range"][k] for k in ("start", "end"))
                self.docs[uri].apply_change(change["text"], Position(start["line"], start["character"]),
                                            Position(end["line"], end["character"]))
            self.versions[uri] = params["textDocument"]["version"]


def messages(stream: FuzzStream, count: int):
    """The stream's messages as the harness takes them: made one at a time."""
    return itertools.chain(stream.opening(), (stream.next() for _ in range(count)))


def test_the_same_seed_gives_the_same_stream_and_another_seed_another():
    one, two, other = FuzzStream(3), FuzzStream(3), FuzzStream(4)
    a = [m.data for m in one.opening() + [one.next() for _ in range(300)]]
    assert a == [m.data for m in two.opening() + [two.next() for _ in range(300)]]
    assert a != [m.data for m in other.opening() + [other.next() for _ in range(300)]]


def test_the_streams_copy_of_each_document_and_each_requests_version_are_what_a_server_holds():
    stream, replay = FuzzStream(7, huge_mb=1), Replay()
    kinds, asked = set(), 0
    for message in messages(stream, 1500):
        kinds.add(message.kind)
        if message.kind in NOISE:
            continue
        for body in bodies(message):
            if body.get("method") in DOCUMENT_METHODS:
                replay.apply(body)
            elif message.asked and body.get("id") == message.request_ids[0]:  # as the request arrives
                uri = message.asked.uri
                assert body["params"]["textDocument"]["uri"] == uri and body["method"] == message.asked.method
                assert message.asked.version == replay.versions[uri]
                assert message.asked.text == replay.docs[uri].text
                asked += 1
    assert {"edit_past_end", "overlapping_edits", "wrong_shape", "junk_between_frames", "short_length",
            "complete_then_close", "complete_then_edit", "heavy_document", "accepted_flood"} <= kinds
    assert asked > 200
    assert replay.docs.keys() == stream.docs.keys()
    for uri, doc in replay.docs.items():
        assert doc.text == stream.docs[uri].text, uri


def test_a_request_and_a_close_or_edits_behind_it_come_in_one_write():
    stream = FuzzStream(5, heavy=False)
    seen = set()
    for message in messages(stream, 2000):
        if message.kind not in ("complete_then_close", "complete_then_edit"):
            continue
        seen.add(message.kind)
        request, behind = bodies(message)
        uri = message.asked.uri
        assert request["id"] == message.request_ids[0] and request["method"] in (INLINE, COMPLETION)
        assert request["params"]["position"] == dict(zip(("line", "character"), message.asked.position))
        assert behind["params"]["textDocument"]["uri"] == uri
        if message.kind == "complete_then_close":
            assert behind["method"] == "textDocument/didClose"
        else:  # the character before the cursor replaced: the range ends at the request's cursor
            assert behind["method"] == "textDocument/didChange"
            assert behind["params"]["textDocument"]["version"] == message.asked.version + 1
            end = behind["params"]["contentChanges"][0]["range"]["end"]
            assert (end["line"], end["character"]) == tuple(message.asked.position)
    assert seen == {"complete_then_close", "complete_then_edit"}


def test_a_flood_of_acceptances_carries_absurd_arguments_and_each_id():
    stream = FuzzStream(1)
    stream.opening()
    flood = stream.accepted_flood()
    requests = bodies(flood)
    assert len(requests) == ACCEPTED_FLOOD == len(flood.request_ids)
    assert [r["id"] for r in requests] == list(flood.request_ids)
    assert {r["method"] for r in requests} == {"workspace/executeCommand"}
    arguments = [a for r in requests for a in r["params"]["arguments"]]
    assert 4 * 10**30 in arguments and -5 in arguments and any(isinstance(a, str) for a in arguments)


def test_heavy_documents_are_under_and_over_the_completion_limit_with_long_lines():
    stream = FuzzStream(2, huge_mb=12)
    heavy = [m for m in messages(stream, 1200) if m.kind == "heavy_document"]
    sizes = [len(bodies(m)[0]["params"]["textDocument"]["text"]) for m in heavy]
    assert len(sizes) == 3 and sizes[0] < MAX_DOCUMENT_BYTES < sizes[1] < sizes[2]
    text = heavy_text(2**20)
    assert max(len(line) for line in text.split("\n")) == LONG_LINE_CHARS - 1  # and its line break
    assert not any(m.kind == "heavy_document" for m in messages(FuzzStream(2, heavy=False), 1200))


def test_heavy_documents_are_edited_and_completed_in_right_after_they_open():
    stream = FuzzStream(3)
    stream.opening()
    after = [stream.next() for _ in range(410)][399:]  # the first heavy document is the 400th message
    assert [m.kind for m in after[:4]] == ["heavy_document", "heavy_complete", "heavy_edit", "heavy_complete"]
    assert all(len(m.asked.text) >= SMALL_CHARS for m in after[1:4:2])
    assert bodies(after[2])[0]["params"]["textDocument"]["uri"] == after[1].asked.uri


def test_quick_text_finds_the_lines_lsp_text_finds():
    rng = random.Random(0)
    for _ in range(200):
        pieces = ["a", "é", "😀", "\r", "\n", "\r\n", "\u2028", "\x0c"]
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        quick = QuickText(text)
        assert quick.lines() == LspText(text).lines()
        quick.apply((0, 0), (0, 0), "\r")  # a new text: its lines found anew
        assert quick.lines() == LspText("\r" + text).lines()


def test_the_non_ascii_phase_edits_beside_characters_outside_ascii_and_asks_again_behind_an_edit():
    stream, replay = FuzzStream(9), Replay()

    def sent(message) -> list[dict]:
        out = bodies(message)
        assert all(b["params"]["textDocument"]["uri"] == NON_ASCII_URI for b in out)
        for body in out:
            if body.get("method") in DOCUMENT_METHODS:
                replay.apply(body)
        return out

    sent(stream.non_ascii_document())
    for step in range(30):
        if step % 2:
            ask = stream.non_ascii_ask()
            sent(ask)
            again = stream.non_ascii_step(again=True)
            request, edit = sent(again)  # the same request once more, the edit behind it
            assert again.asked.position == ask.asked.position and again.asked.version == ask.asked.version
            assert request["method"] == COMPLETION and edit["params"]["textDocument"]["version"] == ask.asked.version + 1
        else:
            sent(stream.non_ascii_step())
        assert replay.docs[NON_ASCII_URI].text == stream.docs[NON_ASCII_URI].text


def test_a_burst_types_then_asks_at_the_cursor_after_the_typed_character():
    stream = FuzzStream(4)
    stream.opening()
    for message in stream.burst(20):
        edit, request = bodies(message)
        change = edit["params"]["contentChanges"][0]
        assert edit["method"] == "textDocument/didChange" and change["range"]["start"] == change["range"]["end"]
        assert request["params"]["textDocument"]["uri"] == edit["params"]["textDocument"]["uri"]
        assert message.asked.version == edit["params"]["textDocument"]["version"]
        assert message.asked.position[1] > change["range"]["start"]["character"]


def test_wrong_shapes_that_could_touch_a_document_touch_only_the_scratch_one():
    stream = FuzzStream(11, heavy=False)
    stream.opening()
    for _ in range(3000):
        message = stream.next()
        if message.kind != "wrong_shape":
            continue
        for body in bodies(message):
            method = body.get("method", "")
            uri = ((body.get("params") or {}).get("textDocument") or {}).get("uri") \
                if isinstance(body.get("params"), dict) and isinstance(body["params"].get("textDocument"), dict) else None
            if method in ("textDocument/didChange", "textDocument/didOpen") and isinstance(uri, str):
                assert uri == SCRATCH or not uri.startswith("file:///fuzz/d")
