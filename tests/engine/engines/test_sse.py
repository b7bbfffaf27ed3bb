"""The event stream of a serving engine, against a local HTTP server that answers as told."""

import http.server
import socket
import threading

import pytest
from memosight.engine.engines.sse import RemoteError, post_stream


class Answers(http.server.BaseHTTPRequestHandler):
    script: list[tuple[int, str, bytes]] = []  # (status, content type, body) for the next requests

    def do_POST(self):  # noqa: N802 - the stdlib's name
        self.rfile.read(int(self.headers["Content-Length"]))
        status, kind, body = Answers.script.pop(0)
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/completions"
    server.shutdown()


def events(url, status=200, kind="text/event-stream", body=b""):
    Answers.script = [(status, kind, body)]
    return list(post_stream(url, {"prompt": "x"}, {}, timeout_s=5, first_token_timeout_s=5))


def test_data_lines_are_events_until_done_and_comments_are_skipped(url):
    body = b': a comment\n\ndata: {"text": "a"}\n\nevent: x\ndata: {"text": "b"}\n\ndata: [DONE]\n\ndata: {"text": "c"}\n'
    assert events(url, body=body) == [{"text": "a"}, {"text": "b"}]


def test_a_server_that_does_not_stream_gives_one_event(url):
    assert events(url, kind="application/json", body=b'{"content": "whole"}') == [{"content": "whole"}]


@pytest.mark.parametrize("body, kind, words", [  # HTTP statuses: test_remote.py, through the engine
    (b"data: {not json\n\n", "protocol", "not JSON"),
    (b'data: {"error": {"message": "out of memory"}}\n\n', "server", "out of memory"),
])
def test_a_broken_event_mid_stream_names_its_kind(url, body, kind, words):
    with pytest.raises(RemoteError, match=words) as caught:
        events(url, body=body)
    assert caught.value.kind == kind


def test_a_server_nobody_listens_on_is_unreachable_and_a_bad_url_is_said():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(RemoteError) as caught:
        post_stream(f"http://127.0.0.1:{port}/v1/completions", {}, {}, timeout_s=2, first_token_timeout_s=2)
    assert caught.value.kind == "unreachable" and "is it running" in str(caught.value)
    with pytest.raises(RemoteError, match="not an http"):
        post_stream("ftp://host/x", {}, {}, timeout_s=1, first_token_timeout_s=1)
