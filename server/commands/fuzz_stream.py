"""The seeded message stream of `memosight bench fuzz`: what a hostile or broken client sends.

Valid traffic (opens, edits, closes, completion and status requests, cancellations) is mixed with
broken framing, bodies that are not JSON or not UTF-8, messages of wrong shapes and types, unknown
documents and methods, edits past the end and overlapping changes in one message, huge and binary
documents. Every message says whether it is a well-formed request (then it must be answered
exactly once) and the stream keeps its own copy of every document (lsp_text.LspText, written from
the spec) to check the server's against. Messages of a wrong shape that could touch a document go
to SCRATCH only, whose text is not checked: which of them a server applies is its own choice.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass

from .lsp_text import LspText, units

SCRATCH = "file:///fuzz/scratch.py"
MAX_OPEN = 24  # small documents open at once

PIECES = ["\n", "\r", "\r\n", "\t", " ", "é", "中", "😀", "\x00", "\x0c", "\u2028", "def f(x):", "    return x",
          "import os", "a", "b", "(", ")", "#", "\ud800x"]

# Each kind of message and how often it comes (weights).
KINDS = {
    "edit": 26, "overlapping_edits": 4, "edit_past_end": 3, "complete": 16, "cancel": 4, "cancel_unknown": 2,
    "status": 3, "open": 3, "close": 2, "accepted": 1, "unknown_document": 3, "unknown_method": 2,
    "wrong_shape": 12, "junk_between_frames": 4, "header_noise": 2, "not_json": 3, "short_length": 2,
    "binary_document": 1, "visited": 2,
}
HUGE_EVERY = 2500  # messages between two huge documents (opened, edited once, closed)


@dataclass
class Message:
    kind: str
    data: bytes
    request_id: object = None  # a well-formed request: must be answered exactly once


def frame(body: bytes) -> bytes:
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def encode(payload: dict) -> bytes:
    return json.dumps(payload).encode()


def wire(text: str) -> str:
    """The text as the server decodes it: JSON turns a high and a low surrogate side by side into one
    character."""
    return json.loads(json.dumps(text))


class FuzzStream:
    def __init__(self, seed: int, huge_mb: float = 12.0):
        self.rng = random.Random(seed)
        self.huge_mb = huge_mb
        self.docs: dict[str, LspText] = {}
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
        small = [u for u, d in self.docs.items() if len(d.text) < 200_000]  # the model is slow on huge ones
        return self.rng.choice(small) if small else None

    def _position(self, model: LspText) -> tuple[int, int]:
        lines = model.lines()
        line = self.rng.randrange(len(lines))
        return model.position(line, self.rng.randint(0, len(lines[line][1])))

    def _change(self, uri: str, start: tuple[int, int], end: tuple[int, int], text: str) -> dict:
        self.docs[uri].apply(start, end, wire(text))
        return {"range": {"start": {"line": start[0], "character": start[1]},
                          "end": {"line": end[0], "character": end[1]}}, "text": text}

    def _did_change(self, uri: str, changes: list[dict]) -> bytes:
        self.versions[uri] += 1
        return frame(encode({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {
            "textDocument": {"uri": uri, "version": self.versions[uri]}, "contentChanges": changes}}))

    def _open(self, uri: str, text: str) -> bytes:
        self.docs[uri], self.versions[uri] = LspText(wire(text)), 1
        return frame(encode({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {
            "textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": text}}}))

    def _close(self, uri: str) -> bytes:
        del self.docs[uri], self.versions[uri]
        return frame(encode({"jsonrpc": "2.0", "method": "textDocument/didClose",
                             "params": {"textDocument": {"uri": uri}}}))

    def _request(self, method: str, params, kind: str) -> Message:
        msg_id = self._id()
        return Message(kind, frame(encode({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params})),
                       msg_id)

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
        """What comes after initialize: a few documents, and the scratch document."""
        out = [Message("open", self._open(SCRATCH, "x = 1\n"))]
        for _ in range(4):
            out.append(self._new_document())
        return out

    def _new_document(self) -> Message:
        self.opened += 1
        return Message("open", self._open(f"file:///fuzz/d{self.opened}.py", self._text(self.rng.randint(0, 60))))

    def next(self) -> Message:
        self.sent += 1
        if self.sent % HUGE_EVERY == 0:
            return self._huge()
        kind = self.rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        uri = self._uri()
        if kind == "open" or uri is None or (uri == SCRATCH and kind in ("edit", "overlapping_edits",
                                                                          "edit_past_end", "complete")):
            return self._close_one() if len(self.docs) >= MAX_OPEN else self._new_document()
        if kind == "close":
            return self._close_one()
        return getattr(self, f"_{kind}")(uri)

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
        return self._request("textDocument/inlineCompletion",
                             self._completion_params(uri, self._position(self.docs[uri])), "complete")

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

    def _accepted(self, uri: str) -> Message:
        return self._request("workspace/executeCommand",
                             {"command": "memosight.accepted", "arguments": [self.rng.randint(0, 40)]}, "accepted")

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
            return Message("wrong_shape", frame(encode(payload)), payload["id"])
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

    def _huge(self) -> Message:
        """A document of `huge_mb` MB of code: opened now, closed by a later close (they take it first)."""
        self.opened += 1
        line = "    value = compute(value, 'abcdefghijklmnopqrstuvwxyz')  # a comment\n"
        text = "def f(value):\n" + line * int(self.huge_mb * 2**20 / len(line))
        return Message("huge_document", self._open(f"file:///fuzz/huge{self.opened}.py", text))
