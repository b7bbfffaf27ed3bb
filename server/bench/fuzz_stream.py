"""The seeded message stream of `memosight bench fuzz`: what a hostile or broken client sends.

Valid traffic (opens, edits, closes, completion and status requests, cancellations) is mixed with
broken framing, bodies that are not JSON or not UTF-8, messages of wrong shapes and types, unknown
documents and methods, edits past the end and overlapping changes in one message, binary documents,
acceptances with absurd arguments and floods of them. Completion requests come alone or, in the
same write, followed by a close of their document or by the user typing on in it (the character
before the cursor deleted, one outside ASCII typed): the server must answer in the request's
version. Half of them go to a few code documents that only typing touches (random pieces soon put
a NUL in a document, and the server completes nothing in one that looks binary). Heavy documents
come at fixed places (5 MB, 9 MB -- over the server's 8 MB completion limit -- and `huge_mb`, with
50,000-character lines), and are edited and completed in. Then the phases the harness drives step
by step: edits around characters outside ASCII (`non_ascii_step`), a typist's burst (`burst`).

Every message says which well-formed requests it carries (each must be answered exactly once) and,
for a completion request, the document's text, version and cursor as the client sent it (`Asked`:
its answer is checked against that version: fuzz_checks.py). The stream keeps its own
copy of every document (lsp_text.LspText, written from the spec; QuickText finds the same lines
faster) to check the server's against. Messages of a wrong shape that could touch a document go
to SCRATCH only, whose text is not checked: which of them a server applies is its own choice.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import re
from dataclasses import dataclass

from .lsp_text import LspText, units

SCRATCH = "file:///fuzz/scratch.py"
MAX_OPEN = 24  # small documents open at once
SMALL_CHARS = 200_000  # documents under this are small: the random traffic goes to them

PIECES = ["\n", "\r", "\r\n", "\t", " ", "é", "中", "😀", "\x00", "\x0c", "\u2028", "def f(x):", "    return x",
          "import os", "a", "b", "(", ")", "#", "\ud800x"]
TYPED = ["ß", "é", "😀", "中", "a", "_"]  # what a user types on behind a completion request

# Code documents: typed in (TYPED) and completed in, never given random pieces (a NUL makes a
# document look binary, and the server answers nothing there): where the model's answers are.
CODE_OPEN = 3  # kept open (a closed one is replaced at the next open)
CODE_TEXTS = [
    ("import os\n\n\nclass Store:\n    def __init__(self, path):\n        self.path = path\n        self.data = {}\n\n"
     "    def get(self, key):\n        return self.data.get(key)\n\n    def put(self, key, value):\n"
     "        self.data[key] = value\n        cl\n"),
    ("def mean(values):\n    total = 0\n    for value in values:\n        total += value\n    return total / len(values)\n"
     "\n\ndef main():\n    numbers = [1, 2, 3]\n    print(mean(numbers))\n    result = \n"),
    ("# é😀 ü: text outside ASCII\nnames = ['é', '😀', 'ü']\n\n\ndef greet(name):\n    message = f'hello {name}'\n"
     "    return mess\n"),
]

# Each kind of message and how often it comes (weights). The heavy_ kinds go to a heavy document
# when one is open, else to a small one as their plain kind.
KINDS = {
    "edit": 26, "overlapping_edits": 4, "edit_past_end": 3, "complete": 14, "complete_then_close": 2,
    "complete_then_edit": 5, "cancel": 4, "cancel_unknown": 2, "status": 3, "open": 4, "close": 2, "accepted": 2,
    "unknown_document": 3, "unknown_method": 2, "wrong_shape": 12, "junk_between_frames": 4, "header_noise": 2,
    "not_json": 3, "short_length": 2, "binary_document": 1, "visited": 2, "heavy_edit": 2, "heavy_complete": 2,
}
TYPING = {"complete", "complete_then_close", "complete_then_edit"}  # kinds that go to code documents half the time
TOUCHES_TEXT = {"edit", "overlapping_edits", "edit_past_end", "complete", "complete_then_close", "complete_then_edit"}

INLINE, COMPLETION = "textDocument/inlineCompletion", "textDocument/completion"
COMPLETION_SHARE = 0.3  # of completion requests, those of textDocument/completion (items with a range)

# Heavy documents: one every HEAVY_EVERY messages, of these sizes in turn (MB; None: --huge-mb).
# 5 MB is under the server's 8 MB completion limit, 9 MB over it.
HEAVY_EVERY = 400
HEAVY_MB = (5, 9, None)
HEAVY_FOLLOW_UP = {1: "heavy_complete", 2: "heavy_edit", 3: "heavy_complete"}  # the messages after one, by place
CODE_LINE = "    value = compute(value, 'abcdefghijklmnopqrstuvwxyz')  # a comment\n"
LONG_LINE_CHARS = 50_000
LONG_LINE_EVERY = 2**19  # characters of code between two long lines in a heavy document

# Acceptances with arguments no client should send (the server once counted 4e30 characters), and
# once in a while a flood of them in one write.
ABSURD_ACCEPTED = [4 * 10**30, -5, "12", None, 2.5, 2**63, [3], True]
ACCEPTED_FLOOD, ACCEPTED_FLOOD_EVERY, ACCEPTED_FLOOD_AT = 1000, 2500, 300

# The phase of edits around characters outside ASCII (😀 is two UTF-16 units), checked by digest
# after each step.
NON_ASCII_URI = "file:///fuzz/non_ascii.py"
NON_ASCII_TEXT = ("names = ['é', '😀', 'ü']\n\n\ndef greet(name):\n    größe = len(name)  # é😀 ü\n"
                  "    return f'héllo {name} 😀' * grö\r\n\n\nclass Straße:\n    maß = 1\n\n    def zeige(self):\n"
                  "        return self.ma\n")
NON_ASCII_PIECES = ["é", "😀", " ü", "ß", "中", "😀😀", "\n", "\r\n", "x", ""]
LINE_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass
class Asked:
    """A completion request as the client sent it: the document's text and version then, and the
    cursor. Its answer is checked against this, whatever came after it."""
    method: str
    uri: str
    version: int
    text: str
    position: tuple[int, int]
    sent_at: float = 0.0  # perf_counter when written (the harness sets it), for the latency


@dataclass
class Message:
    kind: str
    data: bytes
    request_ids: tuple = ()  # the well-formed requests it carries: each must be answered exactly once
    asked: Asked | None = None  # a completion request in an open document


class QuickText(LspText):
    """LspText with its lines found by a regular expression (the same rule: "\r\n", else "\r" or
    "\n") and kept until the text changes: LspText walks every character in Python, seconds for a
    heavy document."""

    def lines(self) -> list[tuple[int, str]]:
        if getattr(self, "_lines_of", None) is not self.text:
            out, start, text = [], 0, self.text
            for match in LINE_BREAK.finditer(text):
                out.append((start, text[start:match.start()]))
                start = match.end()
            out.append((start, text[start:]))
            self._lines, self._lines_of = out, text
        return self._lines


def heavy_text(chars: int) -> str:
    """About `chars` characters of code: 70-character lines, and every LONG_LINE_EVERY characters
    a line of LONG_LINE_CHARS (a string with characters outside ASCII)."""
    long_line = ("    data = '" + "é😀 üabcdefghijkl" * (LONG_LINE_CHARS // 16))[:LONG_LINE_CHARS - 2] + "'\n"
    block = CODE_LINE * (LONG_LINE_EVERY // len(CODE_LINE)) + long_line
    rest = CODE_LINE * ((chars % len(block)) // len(CODE_LINE))
    return "def f(value):\n" + block * (chars // len(block)) + rest


def frame(body: bytes) -> bytes:
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def encode(payload: dict) -> bytes:
    return json.dumps(payload).encode()


def wire(text: str) -> str:
    """The text as the server decodes it: JSON turns a high and a low surrogate side by side into one
    character."""
    return json.loads(json.dumps(text))


class FuzzStream:
    def __init__(self, seed: int, huge_mb: float = 12.0, heavy: bool = True):
        self.rng = random.Random(seed)
        self.huge_mb = huge_mb
        self.heavy = heavy  # heavy documents at their places (False: a run to compare with)
        self.heavies = 0
        self.asked_at = (0, 0)  # (line, character index) of the last non_ascii_ask
        self.docs: dict[str, LspText] = {}
        self.code: set[str] = set()  # the code documents open
        self.versions: dict[str, int] = {}
        self.opened = 0
        self.next_id = 0
        self.recent_ids: list[object] = []
        self.sent = 0

    # --- building blocks ------------------------------------------------------------------------

    def _id(self) -> object:
        self.next_id += 1
        msg_id = self.next_id if self.rng.random() < 0.8 else f"r{self.next_id}"  # ids may be strings
        self.recent_ids = (self.recent_ids + [msg_id])[-20:]
        return msg_id

    def _text(self, pieces: int) -> str:
        return "".join(self.rng.choice(PIECES) if self.rng.random() < 0.7 else self.rng.choice("abcxyz_=:.")
                       for _ in range(pieces))

    def _uri(self) -> str | None:
        small = [u for u, d in self.docs.items() if len(d.text) < SMALL_CHARS and u not in self.code]
        return self.rng.choice(small) if small else None  # (the model is slow on heavy ones)

    def _typed_uri(self) -> str | None:
        """Where a user types: a code document, else a small one whose text is checked."""
        small = sorted(self.code) or [u for u, d in self.docs.items() if len(d.text) < SMALL_CHARS and u != SCRATCH]
        return self.rng.choice(small) if small else None

    def _heavy_uri(self) -> str | None:
        heavy = [u for u, d in self.docs.items() if len(d.text) >= SMALL_CHARS]
        return self.rng.choice(heavy) if heavy else None

    def _cursor(self, model: LspText, long_lines: bool = False) -> tuple[int, int]:
        """(line, character index) of a random place; `long_lines`: on one of the longest lines at
        times (a heavy document's 50,000-character lines are a few among many thousands)."""
        lines = model.lines()
        line = self.rng.randrange(len(lines))
        if long_lines and self.rng.random() < 0.5:
            long = [i for i, (_, content) in enumerate(lines) if len(content) >= LONG_LINE_CHARS // 2]
            line = self.rng.choice(long) if long else line
        return line, self.rng.randint(0, len(lines[line][1]))

    def _position(self, model: LspText, long_lines: bool = False) -> tuple[int, int]:
        return model.position(*self._cursor(model, long_lines))

    def _change(self, uri: str, start: tuple[int, int], end: tuple[int, int], text: str) -> dict:
        self.docs[uri].apply(start, end, wire(text))
        return {"range": {"start": {"line": start[0], "character": start[1]},
                          "end": {"line": end[0], "character": end[1]}}, "text": text}

    def _did_change(self, uri: str, changes: list[dict]) -> bytes:
        self.versions[uri] += 1
        return frame(encode({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {
            "textDocument": {"uri": uri, "version": self.versions[uri]}, "contentChanges": changes}}))

    def _open(self, uri: str, text: str) -> bytes:
        self.docs[uri], self.versions[uri] = QuickText(wire(text)), 1
        return frame(encode({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {
            "textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}}}))

    def _close(self, uri: str) -> bytes:
        del self.docs[uri], self.versions[uri]
        self.code.discard(uri)
        return frame(encode({"jsonrpc": "2.0", "method": "textDocument/didClose",
                             "params": {"textDocument": {"uri": uri}}}))

    def _request(self, method: str, params, kind: str) -> Message:
        msg_id = self._id()
        return Message(kind, frame(encode({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})),
                       (msg_id,))

    def _ask(self, uri: str, position: tuple[int, int], kind: str, method: str | None = None) -> Message:
        """A completion request (`method`; else inline, or the completion list at times) at `position`,
        with what it saw: the document's text and version now."""
        method = method or (COMPLETION if self.rng.random() < COMPLETION_SHARE else INLINE)
        message = self._request(method, self._completion_params(uri, position), kind)
        message.asked = Asked(method, uri, self.versions[uri], self.docs[uri].text, position)
        return message

    @staticmethod
    def _then(message: Message, data: bytes) -> Message:
        """`message` with `data` right behind it in one write: read while the request is in flight."""
        return dataclasses.replace(message, data=message.data + data)

    def _completion_params(self, uri: str, position: tuple[int, int]) -> dict:
        return {"textDocument": {"uri": uri}, "position": {"line": position[0], "character": position[1]},
                "context": {"triggerKind": self.rng.choice([1, 2])}}

    def _json_value(self, depth: int = 0):
        r = self.rng.random()
        if depth > 2 or r < 0.5:
            return self.rng.choice([None, True, False, 0, -1, 2**40, -2**70, 1.5, "", "x", "\ud800", "\x00",
                                    "file:///x%00.py", "😀" * 3, "a" * self.rng.choice([1, 300, 20_000])])
        if r < 0.75:
            return [self._json_value(depth + 1) for _ in range(self.rng.randint(0, 3))]
        return {self.rng.choice(["line", "uri", "text", "x", ""]): self._json_value(depth + 1)
                for _ in range(self.rng.randint(0, 3))}

    def _mutated(self, params):
        """`params` with one place replaced by any JSON value, removed, or given an extra member."""
        params = copy.deepcopy(params)
        places, stack = [], [((), params)]
        while stack:
            path, value = stack.pop()
            if path:
                places.append(path)
            items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
            stack.extend(((*path, k), v) for k, v in items)
        if not places:
            return self._json_value()
        place = self.rng.choice(places)
        parent = params
        for step in place[:-1]:
            parent = parent[step]
        how = self.rng.choice(["replace", "remove", "extra"])
        if how == "replace" or (how == "remove" and isinstance(parent, list)):
            parent[place[-1]] = self._json_value()
        elif how == "remove":
            del parent[place[-1]]
        elif isinstance(parent, dict):
            parent[self.rng.choice(["zz", "uri", ""])] = self._json_value()
        return params

    # --- the stream -----------------------------------------------------------------------------

    def opening(self) -> list[Message]:
        """What comes after initialize: the scratch document, the code documents, one more."""
        out = [Message("open", self._open(SCRATCH, "x = 1\n"))]
        for _ in range(4):
            out.append(self._new_document())
        return out

    def _new_document(self) -> Message:
        self.opened += 1
        if len(self.code) < CODE_OPEN:
            uri = f"file:///fuzz/code{self.opened}.py"
            self.code.add(uri)
            return Message("open", self._open(uri, self.rng.choice(CODE_TEXTS)))
        return Message("open", self._open(f"file:///fuzz/d{self.opened}.py", self._text(self.rng.randint(0, 60))))

    def next(self) -> Message:
        self.sent += 1
        scheduled = self._scheduled()
        if scheduled is not None:
            return scheduled
        kind = self.rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        if kind.startswith("heavy_"):
            heavy = self._heavy_uri()
            if heavy is not None:
                return getattr(self, f"_{kind}")(heavy)
            kind = kind.removeprefix("heavy_")
        uri = self._typed_uri() if kind in TYPING and self.rng.random() < 0.5 else self._uri()
        if kind == "open" or uri is None or (uri == SCRATCH and kind in TOUCHES_TEXT):
            return self._close_one() if len(self.docs) >= MAX_OPEN else self._new_document()
        if kind == "close":
            return self._close_one()
        return getattr(self, f"_{kind}")(uri)

    def _scheduled(self) -> Message | None:
        """What comes at fixed places, so that a short run has it too: a heavy document every
        HEAVY_EVERY messages, then an edit and completion requests in one (the random heavy_ kinds
        come seldom before a close takes it), a flood of acceptances every ACCEPTED_FLOOD_EVERY."""
        if self.heavy and self.sent % HEAVY_EVERY == 0:
            return self._heavy()
        if self.heavy and (follow_up := HEAVY_FOLLOW_UP.get(self.sent % HEAVY_EVERY)) and (uri := self._heavy_uri()):
            return getattr(self, f"_{follow_up}")(uri)
        if self.sent % ACCEPTED_FLOOD_EVERY == ACCEPTED_FLOOD_AT:
            return self.accepted_flood()
        return None

    def _edit(self, uri: str) -> Message:
        model = self.docs[uri]
        start, end = sorted([self._position(model), self._position(model)])
        return Message("edit", self._did_change(uri, [self._change(uri, start, end, self._text(self.rng.randint(0, 6)))]))

    def _overlapping_edits(self, uri: str) -> Message:
        changes = []
        for _ in range(self.rng.randint(2, 4)):  # each applies to the text the ones before it left
            model = self.docs[uri]
            start, end = sorted([self._position(model), self._position(model)])
            changes.append(self._change(uri, start, end, self._text(self.rng.randint(0, 4))))
        return Message("overlapping_edits", self._did_change(uri, changes))

    def _edit_past_end(self, uri: str) -> Message:
        model = self.docs[uri]
        count = model.line_count()
        line = self.rng.randrange(count)
        start = (line, sum(units(c) for c in model.lines()[line][1]) + self.rng.randint(1, 50))  # past the line's end
        end = (count + self.rng.randint(0, 5), self.rng.randint(0, 9))  # past the last line
        return Message("edit_past_end", self._did_change(uri, [self._change(uri, start, end, self._text(2))]))

    def _complete(self, uri: str) -> Message:
        return self._ask(uri, self._position(self.docs[uri]), "complete")

    def _complete_then_close(self, uri: str) -> Message:
        """A completion request and its document's close in one write: the server must not answer
        that the document is not open (it was when the request came)."""
        asking = self._ask(uri, self._position(self.docs[uri]), "complete_then_close")
        return self._then(asking, self._close(uri))

    def _complete_then_edit(self, uri: str, kind: str = "complete_then_edit", at: tuple[int, int] | None = None,
                            method: str | None = None) -> Message:
        """A completion request at `at` (line, character index; else anywhere) and the user typing on,
        in one write: the character before the cursor deleted and another typed (often outside
        ASCII: `cl|` becomes `cß|`), at times one more after it. The answer must be built on the
        request's version."""
        model = self.docs[uri]
        line, index = at or self._cursor(model)
        cursor = model.position(line, index)
        asking = self._ask(uri, cursor, kind, method)
        typed = self.rng.choice(TYPED)
        changes = [self._change(uri, model.position(line, max(0, index - 1)), cursor, typed)]
        if self.rng.random() < 0.5:
            after = model.position(line, max(0, index - 1) + 1)
            changes.append(self._change(uri, after, after, self.rng.choice(TYPED)))
        return self._then(asking, self._did_change(uri, changes))

    def _heavy_edit(self, uri: str) -> Message:
        """A short edit in a heavy document, on one of its long lines at times."""
        model = self.docs[uri]
        start = self._position(model, long_lines=True)
        return Message("heavy_edit", self._did_change(uri, [self._change(uri, start, start, self._text(3))]))

    def _heavy_complete(self, uri: str) -> Message:
        return self._ask(uri, self._position(self.docs[uri], long_lines=True), "heavy_complete")

    def _cancel(self, uri: str) -> Message:
        target = self.rng.choice(self.recent_ids) if self.recent_ids else 1
        return Message("cancel", frame(encode({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": target}})))

    def _cancel_unknown(self, uri: str) -> Message:
        target = self.rng.choice([10**9 + self.sent, f"nobody-{self.sent}", None, -1])
        return Message("cancel_unknown",
                       frame(encode({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": target}})))

    def _status(self, uri: str) -> Message:
        return self._request("memosight/status", {}, "status")

    def _close_one(self) -> Message:
        """Close a document: a huge one first, else any but the scratch one."""
        candidates = [u for u in self.docs if u != SCRATCH]
        if not candidates:
            return self._new_document()
        uri = max(candidates, key=lambda u: len(self.docs[u].text)) if self.rng.random() < 0.5 else \
            self.rng.choice(candidates)
        return Message("close", self._close(uri))

    def _accepted(self, uri: str | None) -> Message:
        """The client says it took a suggestion: characters as a client counts them, or absurd."""
        chars = self.rng.randint(0, 40) if self.rng.random() < 0.5 else self.rng.choice(ABSURD_ACCEPTED)
        arguments = [chars] if self.rng.random() < 0.9 else []
        return self._request("workspace/executeCommand",
                             {"command": "memosight.accepted", "arguments": arguments}, "accepted")

    def accepted_flood(self) -> Message:
        """ACCEPTED_FLOOD acceptances in one write, half of them absurd."""
        floods = [self._accepted(None) for _ in range(ACCEPTED_FLOOD)]
        return Message("accepted_flood", b"".join(m.data for m in floods),
                       tuple(i for m in floods for i in m.request_ids))

    def _unknown_document(self, uri: str) -> Message:
        return self._request("textDocument/inlineCompletion",
                             self._completion_params(f"file:///fuzz/never-{self.sent}.py", (0, 0)), "unknown_document")

    def _unknown_method(self, uri: str) -> Message:
        if self.rng.random() < 0.5:
            return self._request(f"memosight/nothing{self.sent % 7}", {"x": 1}, "unknown_method")
        return Message("unknown_method", frame(encode({"jsonrpc": "2.0", "method": "nothing/here", "params": {}})))

    def _wrong_shape(self, uri: str) -> Message:
        position = {"line": 0, "character": 1}
        templates = [
            ("textDocument/inlineCompletion", True, {"textDocument": {"uri": uri}, "position": position,
                                                     "context": {"triggerKind": 1}}),
            ("textDocument/completion", True, {"textDocument": {"uri": uri}, "position": position}),
            ("memosight/status", True, {"recent": True}),
            ("workspace/executeCommand", True, {"command": "memosight.accepted", "arguments": [3]}),
            ("textDocument/didChange", False, {"textDocument": {"uri": SCRATCH, "version": 7}, "contentChanges": [
                {"range": {"start": position, "end": position}, "text": "z"}]}),
            ("textDocument/didOpen", False, {"textDocument": {"uri": SCRATCH, "languageId": "python", "version": 1,
                                                              "text": "y = 2\n"}}),
            ("textDocument/didSave", False, {"textDocument": {"uri": uri}}),
            ("memosight/visited", False, {"textDocument": {"uri": uri}, "line": 2}),
            ("workspace/didChangeConfiguration", False, {"settings": {"memosight": {"maxNewTokens": 4}}}),
            ("$/setTrace", False, {"value": "off"}),
        ]
        method, is_request, params = self.rng.choice(templates)
        params = self._mutated(params) if self.rng.random() < 0.85 else params
        payload = {"jsonrpc": "2.0", "method": method, "params": params}
        if self.rng.random() < 0.1:
            del payload["params"]
        if is_request != (self.rng.random() < 0.1):  # sometimes the wrong kind: a notification with an id
            payload["id"] = self._id()
            return Message("wrong_shape", frame(encode(payload)), (payload["id"],))
        return Message("wrong_shape", frame(encode(payload)))

    def _junk_between_frames(self, uri: str) -> Message:
        junk = bytes(self.rng.randrange(256) for _ in range(self.rng.randint(1, 200)))
        return Message("junk_between_frames", junk.replace(b"Content-Length", b"X").replace(b"ontent-", b"x") + b"\r\n")

    def _header_noise(self, uri: str) -> Message:
        noise = self.rng.choice([b"Content-Type: text/plain\r\n", b"X-Whatever: 1\r\n", b"\r\n", b"content-length: x\r\n"])
        return Message("header_noise", noise)

    def _not_json(self, uri: str) -> Message:
        body = self.rng.choice([b"{", b'{"jsonrpc": "2.0", "id": 1, "method": ', b"\xff\xfe\x00\x01", b"[" * 5000,
                                b'{"jsonrpc":"2.0","id":NaN,"method":"x"}', b"null", b"[]", b'"text"',
                                b'{"jsonrpc":"2.0","id":1e400,"method":"memosight/status"}'])
        return Message("not_json", frame(body))

    def _short_length(self, uri: str) -> Message:
        """A request whose Content-Length is shorter than its body: the server reads a broken body,
        drops the rest of the line, and finds the next header. Not a well-formed request."""
        body = encode({"jsonrpc": "2.0", "id": f"short-{self.sent}", "method": "memosight/status", "params": {}})
        return Message("short_length", b"Content-Length: %d\r\n\r\n" % (len(body) // 2) + body)

    def _binary_document(self, uri: str) -> Message:
        self.opened += 1
        text = "".join(self.rng.choice(["\x00", "\x01", "\xff", "PK\x03\x04", "abc"]) for _ in range(200))
        return Message("binary_document", self._open(f"file:///fuzz/bin{self.opened}.py", text))

    def _visited(self, uri: str) -> Message:
        return Message("visited", frame(encode({"jsonrpc": "2.0", "method": "memosight/visited", "params": {
            "textDocument": {"uri": uri}, "line": self.rng.randint(0, 50), "entered": self.rng.random() < 0.5}})))

    def _heavy(self) -> Message:
        """The next heavy document (HEAVY_MB in turn): opened now, edited and completed in by the
        heavy_ kinds, closed by a later close (they take the largest first)."""
        mb = HEAVY_MB[self.heavies % len(HEAVY_MB)] or self.huge_mb
        self.heavies += 1
        self.opened += 1
        return Message("heavy_document", self._open(f"file:///fuzz/heavy{self.opened}.py", heavy_text(int(mb * 2**20))))

    # --- the phases the harness drives ------------------------------------------------------------

    def non_ascii_document(self) -> Message:
        return Message("open", self._open(NON_ASCII_URI, NON_ASCII_TEXT))

    def non_ascii_ask(self) -> Message:
        """A completion request alone at the end of a line of NON_ASCII_URI. The harness waits for its
        answer (the server's completion cache then holds it), then sends non_ascii_step(again=True)."""
        model = self.docs[NON_ASCII_URI]
        lines = model.lines()
        line = self.rng.randrange(len(lines))
        self.asked_at = (line, len(lines[line][1]))
        return self._ask(NON_ASCII_URI, model.position(*self.asked_at), "non_ascii_ask", COMPLETION)

    def non_ascii_step(self, again: bool = False) -> Message:
        """An edit in NON_ASCII_URI before, after or over a character outside ASCII (or from one such
        character to another), at times behind a completion request at its start in the same write.
        `again`: behind non_ascii_ask's request once more (answered at once from the cache, so
        built while the edit waits), the character before its cursor replaced."""
        if again:
            return self._complete_then_edit(NON_ASCII_URI, "non_ascii_step", self.asked_at, COMPLETION)
        model = self.docs[NON_ASCII_URI]
        spots = [model.position(line, i + self.rng.randint(0, 1))  # before the character or after it
                 for line, (_, content) in enumerate(model.lines()) for i, ch in enumerate(content) if ord(ch) > 127]
        spots = spots or [self._position(model)]
        start, end = sorted([self.rng.choice(spots), self.rng.choice(spots)])
        if self.rng.random() < 0.5:
            end = start  # an insertion
        asking = self._ask(NON_ASCII_URI, start, "non_ascii_step") if self.rng.random() < 0.4 else None
        data = self._did_change(NON_ASCII_URI, [self._change(NON_ASCII_URI, start, end,
                                                               self.rng.choice(NON_ASCII_PIECES))])
        return self._then(asking, data) if asking else Message("non_ascii_step", data)

    def burst(self, rounds: int) -> list[Message]:
        """A typist racing on in the code documents: `rounds` times a character typed and a
        completion request after it, in one write. Each request starts a generation (nothing came
        behind it), each edit a warm-up, each answer a prefetch: what a client leaves in flight
        when it quits."""
        out = []
        for _ in range(rounds):
            uri = self._typed_uri()
            out.append(self._type_then_ask(uri) if uri else self._new_document())
        return out

    def _type_then_ask(self, uri: str) -> Message:
        model = self.docs[uri]
        line, index = self._cursor(model)
        cursor = model.position(line, index)
        typed = self._did_change(uri, [self._change(uri, cursor, cursor, self.rng.choice(TYPED))])
        asking = self._ask(uri, model.position(line, index + 1), "burst")
        return dataclasses.replace(asking, data=typed + asking.data)
