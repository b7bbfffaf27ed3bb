"""Remote engines against a local test server that speaks both protocols: SSE framing split across
chunks, stop rules, errors a user can act on, slow first tokens, disconnects, cancellation that
reaches the server, TLS with a CA made here, the API key from its environment variable, and the
fallback while the server is down."""

import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from memosight.engine.engines.remote import RemoteEngine, session_id
from memosight.engine.engines.sse import RemoteError
from memosight.engine.protocol import BackendSpec, CompletionRequest, StopRule


class FakeServer:
    """An OpenAI /v1/completions and llama.cpp /infill server; `script` sets what it answers."""

    def __init__(self, tls_context=None):
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.pieces = ["    return", " a", " +", " b\n", "\n", "def other():\n"]
        self.status = 200
        self.error_body = b""
        self.refuse: dict[str, tuple[int, bytes]] = {}  # path -> (status, body) answered there
        self.first_delay = 0.0
        self.piece_delay = 0.0
        self.drop_after = None  # close the connection after this many pieces
        self.sent = 0  # pieces written before the client went away (or the end)
        self.client_left = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, **body})
                server.headers.append(dict(self.headers))
                status, error_body = server.refuse.get(self.path, (server.status, server.error_body))
                if status != 200:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(error_body)))
                    self.end_headers()
                    self.wfile.write(error_body)
                    return
                time.sleep(server.first_delay)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                infill = self.path.endswith(("/infill", "/completion"))  # llama.cpp's own events
                try:
                    for i, piece in enumerate(server.pieces):
                        if server.drop_after is not None and i == server.drop_after:
                            self.connection.shutdown(socket.SHUT_RDWR)
                            return
                        event = {"content": piece, "stop": False} if infill else {"choices": [{"text": piece}]}
                        data = f"data: {json.dumps(event)}\n\n".encode()
                        half = len(data) // 2  # an event split across two writes
                        self.wfile.write(data[:half])
                        self.wfile.flush()
                        self.wfile.write(data[half:])
                        self.wfile.flush()
                        server.sent = i + 1
                        time.sleep(server.piece_delay)
                    if infill:
                        final = {"content": "", "stop": True, "tokens_evaluated": 40, "tokens_cached": 30}
                    else:
                        final = {"choices": [], "usage": {"prompt_tokens": 40,
                                                          "prompt_tokens_details": {"cached_tokens": 30}}}
                    self.wfile.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    server.client_left.set()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls_context is not None:
            self.httpd.socket = tls_context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, scheme="http", path="/v1"):
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = FakeServer()
    yield s
    s.stop()


def engine_for(url, kind="openai", session_id="", **kw):
    return RemoteEngine(BackendSpec(kind=kind, url=url, timeout_ms=kw.pop("timeout_ms", 3000),
                                    first_token_timeout_ms=kw.pop("first_token_timeout_ms", 1000), **kw),
                        session_id=session_id)


@pytest.mark.parametrize("kind,path", [("openai", "/v1"), ("llamacpp", "")])
def test_a_streamed_completion_stops_at_its_rules_and_reports_the_servers_cache(server, kind, path):
    engine = engine_for(server.url(path=path), kind, model="m", session_id=session_id("me", "/repo"))
    stream = engine.stream(CompletionRequest("def add(a, b):\n", "", stop=StopRule(single_line=True)))
    pieces = list(stream)
    assert "".join(pieces) == "    return a + b" and stream.completion.stop_reason == "newline"
    sent = server.requests[-1]
    if kind == "openai":
        assert sent["path"] == "/v1/completions" and sent["prompt"] == "def add(a, b):\n" and sent["stop"] == ["\n"]
        assert sent["stream"] is True and sent["temperature"] == 0 and sent["model"] == "m"
    else:
        assert sent["path"] == "/infill" and sent["input_prefix"] == "def add(a, b):\n" and sent["prompt"] == ""
        assert sent["cache_prompt"] is True and sent["stream"] is True
    assert server.headers[-1]["X-Session-ID"] == session_id("me", "/repo") and "me" not in server.headers[-1]["X-Session-ID"]
    status = engine.status()["backend"]
    assert status["state"] == "ok" and status["kind"] == kind


def test_llama_cpp_without_fim_tokens_gets_the_prefix_on_completion_from_then_on(server):
    # what llama.cpp answers for a model without FIM tokens (SmolLM2): learnt once, then not asked again
    server.refuse["/infill"] = (501, b'{"error": {"code": 501, "message": "Infill is not supported by this model: '
                                     b'prefix token is missing. suffix token is missing. middle token is missing. "}}')
    engine = engine_for(server.url(path=""), "llamacpp")
    for _ in range(2):
        stream = engine.stream(CompletionRequest("def add(a, b):\n", "\nprint(add(1, 2))\n", stop=StopRule(single_line=True)))
        assert "".join(stream) == "    return a + b"
    assert [r["path"] for r in server.requests] == ["/infill", "/completion", "/completion"]
    sent = server.requests[-1]
    assert sent["prompt"] == "def add(a, b):\n" and "input_suffix" not in sent and sent["cache_prompt"] is True
    assert engine.status()["backend"]["state"] == "ok"


def test_a_local_tokenizer_without_fim_tokens_goes_to_completion_at_once(server, tiny_models):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_models["gpt2"])  # no FIM tokens
    engine = RemoteEngine(BackendSpec(kind="llamacpp", url=server.url(path="")), tokenizer)
    assert "".join(engine.stream(CompletionRequest("x = 1\n", ""))) != ""
    assert [r["path"] for r in server.requests] == ["/completion"]


def test_the_servers_cache_counters_reach_the_status_when_the_stream_runs_to_its_end(server):
    engine = engine_for(server.url(path=""), "llamacpp")
    server.pieces = ["x = 1"]
    stream = engine.stream(CompletionRequest("y = 2\n", ""))
    assert "".join(stream) == "x = 1"
    assert stream.completion.reused_tokens == 30 and stream.completion.prompt_tokens == 40
    assert engine.status()["backend"]["server_cached_share"] == 0.75


def test_consecutive_prompts_report_their_shared_prefix(server):
    engine = engine_for(server.url())
    server.pieces = ["1"]
    for prefix in ("import os\nx = ", "import os\nx = 4"):
        engine.stream(CompletionRequest(prefix, "")).result()
    # the first prompt went without its trailing space (see the healing test)
    assert engine.status()["backend"]["shared_prefix_share"] == round(len("import os\nx =") / len("import os\nx = 4"), 3)


def test_fim_prompts_are_rendered_with_the_models_own_tokens(server):
    class Tokenizer:
        def get_vocab(self):
            return {"<fim_prefix>": 1, "<fim_suffix>": 2, "<fim_middle>": 3}

        def encode(self, text, add_special_tokens=False):
            return text.split()

    engine = RemoteEngine(BackendSpec("openai", server.url()), tokenizer=Tokenizer())
    server.pieces = ["b"]
    engine.stream(CompletionRequest("a = ", "\nprint(a)")).result()
    assert server.requests[-1]["prompt"] == "<fim_prefix>a =<fim_suffix>\nprint(a)<fim_middle>"
    assert engine.count_tokens("x = 1") == 3


@pytest.mark.parametrize("answer,shown", [([" na", "me"], "name"), (["  x"], " x"), (["x"], "x"), ([" ", " y"], " y")])
def test_a_prompt_ending_in_spaces_is_sent_without_them_and_the_answer_loses_them(server, answer, shown):
    # "return " would end inside the token " name": the model sees "return" and writes " name"
    server.pieces = answer
    text = engine_for(server.url()).stream(CompletionRequest("    return ", "")).result().text
    assert server.requests[-1]["prompt"] == "    return" and text == shown


def test_cancelling_closes_the_stream_and_the_server_sees_it(server):
    server.pieces = [f"x{i}" for i in range(200)]
    server.piece_delay = 0.02
    engine = engine_for(server.url())
    request = CompletionRequest("a", "")
    stream = engine.stream(request)
    next(stream)
    threading.Timer(0.1, request.cancel.set).start()
    rest = list(stream)
    assert stream.completion.stop_reason == "cancelled" and len(rest) < 50
    assert server.client_left.wait(3), "the server never noticed the client leave"
    assert server.sent < 100 and engine.status()["backend"]["cancelled"] == 1


def test_closing_the_stream_early_also_reaches_the_server(server):
    server.pieces = [f"x{i}" for i in range(200)]
    server.piece_delay = 0.02
    stream = engine_for(server.url()).stream(CompletionRequest("a", ""))
    next(stream)
    stream.close()
    assert server.client_left.wait(3) and server.sent < 100


@pytest.mark.parametrize("status,body,kind,words", [
    (401, b'{"error": {"message": "bad key"}}', "auth", "backend.api_key_env"),
    (403, b"forbidden", "auth", "backend.api_key_env"),
    (400, b'{"error": {"message": "prompt is too long"}}', "bad_request", "prompt is too long"),
    (404, b'{"error": {"message": "model qwen not found"}}', "not_found", "model qwen not found"),
    (500, b"boom", "server", "boom"),
])
def test_server_errors_say_what_to_do(server, status, body, kind, words):
    server.status, server.error_body = status, body
    with pytest.raises(RemoteError, match=words) as info:
        engine_for(server.url()).stream(CompletionRequest("a", "")).result()
    assert info.value.kind == kind


def test_an_unreachable_server_names_its_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens here
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(RemoteError, match=f"cannot reach the server at {url}") as info:
        engine_for(url).stream(CompletionRequest("a", "")).result()
    assert info.value.kind == "unreachable"


def test_a_slow_first_token_is_a_timeout(server):
    server.first_delay = 1.0
    with pytest.raises(RemoteError, match="first-token timeout") as info:
        engine_for(server.url(), first_token_timeout_ms=200).stream(CompletionRequest("a", "")).result()
    assert info.value.kind == "timeout"


def test_a_server_that_drops_the_connection_midway_is_an_error_not_a_hang(server):
    server.drop_after = 2
    with pytest.raises(RemoteError) as info:
        engine_for(server.url()).stream(CompletionRequest("a", "")).result()
    assert info.value.kind in ("unreachable", "protocol")


def test_the_api_key_comes_from_the_named_environment_variable_and_never_shows(server, monkeypatch):
    engine = engine_for(server.url(), api_key_env="MEMOSIGHT_TEST_KEY")
    with pytest.raises(RemoteError, match="MEMOSIGHT_TEST_KEY"):
        engine.stream(CompletionRequest("a", "")).result()
    monkeypatch.setenv("MEMOSIGHT_TEST_KEY", "sk-secret-123")
    engine.stream(CompletionRequest("a", "")).result()
    assert server.headers[-1]["Authorization"] == "Bearer sk-secret-123"
    assert "sk-secret" not in json.dumps(engine.status())


def test_tls_with_a_ca_bundle(tmp_path):
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    context = __import__("ssl").create_default_context(__import__("ssl").Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    server = FakeServer(tls_context=context)
    try:
        server.pieces = ["ok"]
        with pytest.raises(RemoteError, match="backend.ca_bundle") as info:
            engine_for(server.url("https")).stream(CompletionRequest("a", "")).result()
        assert info.value.kind == "tls"
        bundle = tmp_path / "ca.pem"
        ca.cert_pem.write_to_path(str(bundle))
        assert engine_for(server.url("https"), ca_bundle=str(bundle)).stream(CompletionRequest("a", "")).result().text == "ok"
    finally:
        server.stop()


class Local:
    """A local engine that always answers "local"."""

    def __init__(self):
        self.asked = 0

    def stream(self, request):
        from memosight.engine.protocol import Completion, Stream

        self.asked += 1

        def gen():
            yield "local"
            return Completion("local", 1, 1, 1.0, 1.0, "eos")
        return Stream(gen())

    def status(self):
        return {"model": "local"}

    def close(self):
        pass


def test_while_the_server_is_down_the_fallback_answers_and_the_server_is_retried(server):
    local = Local()
    url = server.url()
    server.stop()
    engine = RemoteEngine(BackendSpec("openai", url, first_token_timeout_ms=500), fallback=lambda: local)
    assert engine.stream(CompletionRequest("a", "")).result().text == "local"
    assert engine.stream(CompletionRequest("a", "")).result().text == "local"  # within the backoff: no new try
    status = engine.status()["backend"]
    assert status["state"] == "unreachable" and status["failures"] == 1 and status["fallback_requests"] == 2
    assert url in status["last_error"]


# --- a real llama.cpp server (llama-cpp-python's), serving the embedded model exported to GGUF -----

def _generated_runs(log: str) -> list[int]:
    """Tokens llama.cpp generated per completion, from its own performance lines."""
    return [int(n) for n in re.findall(r"^llama_perf_context_print:\s+eval time =.*/\s+(\d+) runs", log, re.M)]


def test_a_real_llama_cpp_server_streams_the_completion_it_would_give_in_one_piece(llama_server):
    import urllib.request

    url, _ = llama_server
    engine = engine_for(url, timeout_ms=20000, first_token_timeout_ms=20000)
    prefix = "import os\n\n\ndef read_config(path):\n"
    stream = engine.stream(CompletionRequest(prefix, "", max_new_tokens=24))
    text = "".join(stream)
    whole = json.load(urllib.request.urlopen(urllib.request.Request(
        f"{url}/completions", data=json.dumps({"prompt": prefix, "max_tokens": 24, "temperature": 0}).encode(),
        headers={"Content-Type": "application/json"})))["choices"][0]["text"]
    assert text and text == whole.rstrip() or text == whole
    single = engine.stream(CompletionRequest(prefix, "", max_new_tokens=24, stop=StopRule(single_line=True))).result()
    assert "\n" not in single.text and whole.startswith(single.text)
    assert engine.status()["backend"]["state"] == "ok"


def test_cancelling_stops_the_real_servers_generation(llama_server):
    url, log_path = llama_server
    engine = engine_for(url, timeout_ms=60000, first_token_timeout_ms=20000)
    request = CompletionRequest("import os\n\n\ndef main():\n", "", max_new_tokens=1500)
    stream = engine.stream(request)
    assert next(stream)
    request.cancel.set()
    assert list(stream) == [] or stream.completion.stop_reason == "cancelled"
    # llama-cpp-python's server prints no figures for a stopped completion, and runs one at a time:
    # a 3-token request after it is the next to print, and only if the 1500 tokens were not decoded
    engine.stream(CompletionRequest("x", "", max_new_tokens=3)).result()
    log = log_path.read_text()
    assert "Disconnected from client" in log, "the server never saw the stream closed"
    after = _generated_runs(log[log.rindex("Disconnected from client"):])
    assert after and after[0] < 200, f"after the cancel the server generated {after[:1]} of 1500 tokens"


def test_without_a_fallback_a_dead_server_is_not_asked_again_until_the_backoff_ends(server):
    url = server.url()
    server.stop()
    engine = engine_for(url)
    for _ in range(3):
        with pytest.raises(RemoteError, match="cannot reach"):
            engine.stream(CompletionRequest("a", "")).result()
    assert engine.status()["backend"]["failures"] == 1  # one try; the others waited for the backoff


def test_llama_cpps_own_server_fills_in_the_middle_and_reports_its_cache(llama_cpp_server):
    url, _ = llama_cpp_server
    engine = engine_for(url, "llamacpp", timeout_ms=20000, first_token_timeout_ms=20000)
    prefix, suffix = "def add(a, b):\n    return", "\n\n\ndef sub(a, b):\n    return a - b\n"
    first = engine.stream(CompletionRequest(prefix, suffix, max_new_tokens=16)).result()
    again = engine.stream(CompletionRequest(prefix + " a", suffix, max_new_tokens=16)).result()
    assert first.text and first.prompt_tokens > 0
    # cache_prompt: the second prompt starts as the first did; what was typed is new
    assert 0 < again.reused_tokens < again.prompt_tokens
    assert 0 < engine.status()["backend"]["server_cached_share"] < 1


def test_cancelling_stops_llama_cpps_own_server(llama_cpp_server):
    url, log_path = llama_cpp_server
    engine = engine_for(url, "llamacpp", timeout_ms=60000, first_token_timeout_ms=20000)
    request = CompletionRequest("import os\n\n\ndef main():\n", "", max_new_tokens=1500)
    stream = engine.stream(request)
    assert next(stream)
    request.cancel.set()
    list(stream)

    def logged() -> tuple[list[str], list[str]]:
        """The cancelled tasks, and the tokens the last of them held when it stopped."""
        log = log_path.read_text()
        cancelled = re.findall(r"cancel task, id_task = (\d+)", log)
        if not cancelled:
            return [], []
        return cancelled, re.findall(rf"task {cancelled[-1]} \| stop processing: n_tokens = (\d+)", log)

    # the server notices at its next token, logs the cancel, then the task's stop a moment later
    deadline = time.monotonic() + 20
    while not logged()[1] and time.monotonic() < deadline:
        time.sleep(0.1)
    cancelled, kept = logged()
    assert cancelled, "the server never saw the cancel"
    assert kept and int(kept[-1]) < 200, f"the cancelled task held {kept} tokens (prompt + decoded) of 1500"


def test_a_proxy_from_the_environment_is_used_unless_no_proxy_exempts_the_host(server, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{server.port}")  # the fake server plays the proxy
    monkeypatch.setenv("NO_PROXY", "")
    server.pieces = ["ok"]
    assert engine_for("http://gpu-box.internal:8000/v1").stream(CompletionRequest("a", "")).result().text == "ok"
    assert server.requests[-1]["path"] == "http://gpu-box.internal:8000/v1/completions"  # asked of the proxy
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    engine_for(server.url()).stream(CompletionRequest("a", "")).result()
    assert server.requests[-1]["path"] == "/v1/completions"  # straight to the server


def test_a_server_slower_than_its_first_token_timeout_leaves_the_request_to_the_fallback(server):
    # a one-slot server busy with a cold prompt: the connection opens, the first token is late
    server.first_delay = 2.0
    engine = RemoteEngine(BackendSpec("openai", server.url(), first_token_timeout_ms=1000), fallback=Local)
    assert engine.stream(CompletionRequest("a", "")).result().text == "local"  # answered, not dropped
    status = engine.status()["backend"]
    assert status["fallback_requests"] == 1 and "first-token timeout" in status["fallback_reason"]
    # slow, not gone (a cold prompt on a CPU): no back-off, the next request asks the server again
    assert status["state"] == "slow"
    server.first_delay = 0.0
    assert engine.stream(CompletionRequest("a", "")).result().text != "local"
    assert engine.status()["backend"]["state"] == "ok"


def test_a_real_server_slower_than_the_first_token_timeout_leaves_a_cold_prompt_to_the_local_model(llama_server):
    from memosight.engine import load_engine

    url, _ = llama_server
    local = load_engine()  # the embedded model, as backend.fallback = "local" loads it
    engine = RemoteEngine(BackendSpec("openai", url, timeout_ms=20000, first_token_timeout_ms=5),
                          fallback=lambda: local)
    prefix = "import os\n\n\ndef read_config(path):\n" + "    # a long comment\n" * 200  # a cold prompt
    completion = engine.stream(CompletionRequest(prefix, "", max_new_tokens=8)).result()
    assert completion.stop_reason in ("max_tokens", "eos", "newline")  # answered (by the local model: below)
    status = engine.status()["backend"]
    assert status["fallback_requests"] == 1 and status["fallback_reason"]


def test_llamacpp_infill_sends_the_cursor_line_apart_from_the_lines_above_as_llama_vim_does():
    server = FakeServer()
    engine = engine_for(server.url(path=""), "llamacpp")
    for typed in ("re", "ret"):
        list(engine.stream(CompletionRequest(f"def add(a, b):\n    {typed}", "\n\nprint(add(1, 2))\n",
                                             stop=StopRule(single_line=True))))
    first, second = server.requests[-2:]
    assert first["input_prefix"] == second["input_prefix"] == "def add(a, b):\n"
    assert first["input_suffix"] == second["input_suffix"] == "\n\nprint(add(1, 2))\n"
    assert (first["prompt"], second["prompt"]) == ("    re", "    ret")
    server.stop()


def test_one_engine_spec_names_a_remote_backend_and_its_session_from_the_workspace(server):
    from memosight.engine import EngineSpec, load_engine

    spec = EngineSpec(backend=BackendSpec(kind="openai", url=server.url(), fallback="none"), workspace="/repo")
    engine = load_engine(spec)
    assert isinstance(engine, RemoteEngine) and engine.settings is spec.backend
    assert engine.session_id == session_id(__import__("getpass").getuser(), "/repo")
    assert engine.info().device == "remote" and not engine.info().has_fim  # no local tokenizer: plain prompts
    engine.stream(CompletionRequest("def add(a, b):\n", "")).result()
    assert server.headers[-1]["X-Session-ID"] == engine.session_id
