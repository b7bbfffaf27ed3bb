"""Stand-in LSP servers for the bench clients' tests: a script that reads framed messages from stdin
and writes framed answers, around the handling a test gives it (no memosight-lsp, whose torch
import alone costs seconds)."""

import textwrap

_FRAMING = '''
import json, sys
def send(payload):
    body = json.dumps(payload).encode()
    sys.stdout.buffer.write(b"Content-Length: %d\\r\\n\\r\\n" % len(body) + body)
    sys.stdout.buffer.flush()
def messages():
    while True:
        length = None
        while True:
            line = sys.stdin.buffer.readline()
            if not line:
                sys.exit(0)
            if not line.strip():
                break
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        yield json.loads(sys.stdin.buffer.read(length))
'''


def stand_in_server(setup: str, handle: str) -> str:
    """A server script: `setup` runs once, then `handle` for each `message` read (`send(payload)`
    writes one)."""
    return _FRAMING + textwrap.dedent(setup) + "for message in messages():\n" + textwrap.indent(
        textwrap.dedent(handle), "    ")
