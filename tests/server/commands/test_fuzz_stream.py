import json

from memosight.server.commands.fuzz_stream import SCRATCH, FuzzStream
from memosight.server.documents import Document


def bodies(message) -> list[dict]:
    """The JSON bodies in a message's bytes that parse (framing noise and broken bodies skipped)."""
    out, data = [], message.data
    while b"Content-Length: " in data:
        head, _, data = data.partition(b"Content-Length: ")
        length, _, data = data.partition(b"\r\n\r\n")
        body, data = data[:int(length)], data[int(length):]
        try:
            out.append(json.loads(body))
        except ValueError:
            pass
    return out


def test_the_same_seed_gives_the_same_stream_and_another_seed_another():
    one, two, other = FuzzStream(3), FuzzStream(3), FuzzStream(4)
    a = [m.data for m in one.opening() + [one.next() for _ in range(300)]]
    assert a == [m.data for m in two.opening() + [two.next() for _ in range(300)]]
    assert a != [m.data for m in other.opening() + [other.next() for _ in range(300)]]


def test_the_streams_copy_of_each_document_is_what_a_server_applying_its_edits_holds():
    stream = FuzzStream(7)
    server: dict[str, Document] = {}
    kinds = set()
    for message in stream.opening() + [stream.next() for _ in range(1500)]:
        kinds.add(message.kind)
        if message.kind not in ("open", "close", "edit", "overlapping_edits", "edit_past_end", "binary_document"):
            continue
        (body,) = bodies(message)
        params, uri = body["params"], body["params"]["textDocument"]["uri"]
        if body["method"] == "textDocument/didOpen":
            server[uri] = Document(uri, params["textDocument"]["text"], "python")
        elif body["method"] == "textDocument/didClose":
            del server[uri]
        else:
            doc = server[uri]
            for change in params["contentChanges"]:
                start, end = (change["range"][k] for k in ("start", "end"))
                from memosight.server.documents import Position
                doc.apply_change(change["text"], Position(start["line"], start["character"]),
                                 Position(end["line"], end["character"]))
    assert {"edit_past_end", "overlapping_edits", "wrong_shape", "junk_between_frames", "short_length"} <= kinds
    assert server.keys() == stream.docs.keys()
    for uri, doc in server.items():
        assert doc.text == stream.docs[uri].text, uri


def test_wrong_shapes_that_could_touch_a_document_touch_only_the_scratch_one():
    stream = FuzzStream(11)
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
