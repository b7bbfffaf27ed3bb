"""LSP framing: frames read whole however the bytes arrive, ids found in a skipped body's first
bytes, frames written whole from many threads."""

from __future__ import annotations

import json
import threading

import pytest
from memosight.server.rpc.framing import Framer, FrameWriter, top_level_id


def test_top_level_id_reads_only_the_outer_object():
    assert top_level_id(b'{"jsonrpc":"2.0","id":12,"method":"x","params":{"t":"') == 12
    assert top_level_id(b'{"method":"x","params":{"id":3},"id":"a"}') == "a"
    assert top_level_id(b'{"method":"$/cancelRequest","params":{"id":3}') is None
    assert top_level_id(b'Content-Length: 5\r\n\r\n{"id":1}') is None
    assert top_level_id(b'{"s":"\\"id\\":4","id":5}') == 5


async def test_the_framer_reads_frames_split_anywhere():
    bodies = [json.dumps({"n": i, "pad": "é" * i}).encode() for i in range(20)]
    stream = b"".join(b"Content-Length: %d\r\nContent-Type: application/vscode-jsonrpc\r\n\r\n" % len(b) + b
                      for b in bodies)
    chunks = [stream[i:i + 7] for i in range(0, len(stream), 7)]

    async def read(n: int) -> bytes:
        return chunks.pop(0) if chunks else b""
    framer = Framer(read)
    assert [(await framer.next_body())[0] for _ in bodies] == bodies
    with pytest.raises(EOFError):
        await framer.next_body()


async def test_frames_written_from_many_threads_arrive_whole_and_read_back():
    class Sink:
        def __init__(self):
            self.data, self.flushes = bytearray(), 0

        def write(self, data: bytes) -> None:
            for i in range(0, len(data), 3):  # slowly, so that unlocked writers would interleave
                self.data += data[i:i + 3]

        def flush(self) -> None:
            self.flushes += 1
    sink = Sink()
    writer = FrameWriter(sink)
    bodies = {json.dumps({"thread": t, "n": n}).encode() for t in range(4) for n in range(25)}
    threads = [threading.Thread(target=lambda t=t: [writer.write(json.dumps({"thread": t, "n": n}).encode())
                                                   for n in range(25)]) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    chunks = [bytes(sink.data)]

    async def read(n: int) -> bytes:
        return chunks.pop() if chunks else b""
    framer = Framer(read)
    assert {(await framer.next_body())[0] for _ in bodies} == bodies
    assert sink.flushes == 100  # each frame flushed: stdout must not hold an answer back


def test_a_stream_that_takes_part_of_a_frame_gets_the_rest():
    class Unbuffered:  # stdout under python -u: a raw file whose write() may take fewer bytes
        def __init__(self):
            self.data = bytearray()

        def write(self, data) -> int:
            taken = bytes(data[:5])
            self.data += taken
            return len(taken)
    stream = Unbuffered()
    FrameWriter(stream).write(b'{"id":1}')
    assert bytes(stream.data) == b'Content-Length: 8\r\n\r\n{"id":1}'
