"""`memosight model pull` and `model list`, end to end against a Hugging Face hub stand-in on
127.0.0.1 (the resolve API: HEAD for the metadata, GET with Range), serving a tiny GGUF file that a
catalog entry pins: download and check, no second download, a broken connection resumed, a corrupt
file refused, offline, the progress heard, then the model loads by its name and the config keeps the
name."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from memosight.engine import ModelLoadError, load_engine
from memosight.engine.loading.catalog import CATALOG, CatalogModel
from memosight.server.cli import main

NAME = "tiny-test"
REPO = "memosight-test/Tiny-GGUF"
REVISION = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """Serves one file at /{REPO}/resolve/{REVISION}/{file} the way the hub does for an LFS file:
    X-Repo-Commit, the sha256 as ETag/X-Linked-Etag, X-Linked-Size, Range requests (206)."""

    def __init__(self, file: str, data: bytes):
        self.file, self.data = file, data
        self.body = data  # what GET sends (a test corrupts it)
        self.cut_next_get: int | None = None  # send this many bytes of the next GET, then drop the connection
        self.requests: list[tuple[str, str | None]] = []  # (method, Range header)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _resolve(self) -> bool:
                if self.path != f"/{REPO}/resolve/{REVISION}/{hub.file}":
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return False
                return True

            def _common_headers(self) -> None:
                sha = hashlib.sha256(hub.data).hexdigest()
                self.send_header("X-Repo-Commit", REVISION)
                self.send_header("ETag", f'"{sha}"')
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(len(hub.data)))
                self.send_header("Accept-Ranges", "bytes")

            def do_HEAD(self):
                hub.requests.append(("HEAD", self.headers.get("Range")))
                if self._resolve():
                    self.send_response(200)
                    self._common_headers()
                    self.send_header("Content-Length", str(len(hub.data)))
                    self.end_headers()

            def do_GET(self):
                asked = self.headers.get("Range")
                hub.requests.append(("GET", asked))
                if not self._resolve():
                    return
                body, start = hub.body, 0
                if asked:
                    start = int(re.fullmatch(r"bytes=(\d+)-", asked).group(1))
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self._common_headers()
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                rest = body[start:]
                if hub.cut_next_get is not None:  # the connection breaks part-way
                    rest, hub.cut_next_get = rest[: hub.cut_next_get], None
                    self.close_connection = True
                self.wfile.write(rest)
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def gets(self) -> list[str | None]:
        return [r for method, r in self.requests if method == "GET"]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MEMOSIGHT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def hub(tiny_gguf, cache, monkeypatch):
    import huggingface_hub.constants

    data = tiny_gguf.read_bytes()
    model = CatalogModel(name=NAME, repo=REPO, revision=REVISION, file="tiny-test.gguf",
                         sha256=hashlib.sha256(data).hexdigest(), size=len(data), params=100_000, summary="test")
    monkeypatch.setitem(CATALOG, NAME, model)
    server = FakeHub(model.file, data)
    # set after huggingface_hub was imported: the pull reads HF_ENDPOINT when it runs
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # tests/conftest.py sets it for the rest
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # huggingface_hub read HF_HUB_OFFLINE=1 once, at its import (tests/conftest.py): this test process only
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    # it writes what arrives in chunks of 10 MB; the tiny file needs smaller ones to break off between two
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 32 * 1024)
    yield server
    server.close()


def pull(capsys, *extra: str) -> tuple[int, str, str]:
    code = main(["model", "pull", NAME, *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_pull_downloads_checks_and_a_second_pull_does_not_download(hub, cache, capsys):
    code, out, err = pull(capsys, "--json")
    assert code == 0, err
    result = json.loads(out)
    path = cache / "models" / "tiny-test.gguf"
    assert result["downloaded"] and result["path"] == str(path)
    assert path.read_bytes() == hub.data
    assert sorted(p.name for p in path.parent.iterdir() if not p.name.startswith(".")) == [
        "tiny-test.gguf", "tiny-test.gguf.verified"]
    assert hub.gets() == [None]

    hub.requests.clear()
    code, out, err = pull(capsys)
    assert code == 0 and "already present and verified" in out and "nothing to download" in out
    assert hub.requests == []  # not even a HEAD

    assert main(["model", "list", "--json"]) == 0
    listed = {m["name"]: m for m in json.loads(capsys.readouterr().out)["models"]}
    assert listed[NAME]["state"] == "verified" and listed[NAME]["file_bytes"] == len(hub.data)
    assert listed["qwen2.5-coder-0.5b"]["file_bytes"] == 491400064


def test_a_broken_connection_resumes_where_it_stopped(hub, cache, capsys):
    half = len(hub.data) // 2
    hub.cut_next_get = half  # the first GET breaks off half-way; huggingface_hub asks for the rest
    code, _out, err = pull(capsys)
    assert code == 0, err
    first, then = hub.gets()
    kept = int(re.fullmatch(r"bytes=(\d+)-", then).group(1))  # what had been written when it broke
    assert first is None and half - 32 * 1024 < kept <= half
    assert (cache / "models" / "tiny-test.gguf").read_bytes() == hub.data


def test_what_an_interrupted_pull_left_is_replaced_by_the_next(hub, cache, capsys):
    # hf_hub_download keeps nothing of an interrupted download (it continues a broken connection
    # only within one pull): the next pull starts over, and clears what an older memosight left
    part = cache / "models" / "tiny-test.gguf.part"
    part.parent.mkdir(parents=True)
    third = len(hub.data) // 3
    part.write_bytes(hub.data[:third])
    killed = cache / "models" / ".pull-tiny-test.gguf"  # a pull killed mid-download
    (killed / "junk").mkdir(parents=True)
    main(["model", "list"])
    assert "partial (33%)" in capsys.readouterr().out

    code, _out, err = pull(capsys)
    assert code == 0, err
    assert hub.gets() == [None] and "downloading" in err
    assert (cache / "models" / "tiny-test.gguf").read_bytes() == hub.data
    assert not part.exists() and not killed.exists()


def test_the_progress_callback_hears_the_bytes_and_the_command_shows_a_bar(hub, cache, capsys, monkeypatch):
    from memosight.engine.loading import catalog

    heard = []
    catalog.pull(NAME, progress=lambda done, total: heard.append((done, total)))
    total = len(hub.data)
    assert heard[0] == (0, total) and heard[-1] == (total, total) and len(heard) > 2  # 32 KiB chunks
    assert [done for done, _ in heard] == sorted(done for done, _ in heard)

    (cache / "models" / "tiny-test.gguf").unlink()
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS")
    code, _out, err = pull(capsys)
    assert code == 0 and f"{NAME}: 100%" in err


def test_a_corrupt_download_is_refused_and_nothing_is_left(hub, cache, capsys):
    body = bytearray(hub.data)
    body[len(body) // 2] ^= 0xFF
    hub.body = bytes(body)
    code, out, err = pull(capsys)
    assert code == 2 and out == "" and "Traceback" not in err
    line = err.strip().splitlines()[-1]  # after the progress lines, the error: one line
    assert line.startswith("memosight: ")
    assert "sha256" in line and "deleted it, nothing was installed" in line
    assert not [p for p in (cache / "models").iterdir() if not p.name.startswith(".")]
    with pytest.raises(ModelLoadError, match=f"memosight model pull {NAME}"):
        load_engine(NAME, device="cpu")


@pytest.mark.parametrize("how", ["HF_HUB_OFFLINE", "unreachable"])
def test_offline_says_which_url_to_fetch_and_where_to_put_it(hub, cache, capsys, monkeypatch, how):
    if how == "HF_HUB_OFFLINE":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        endpoint = hub.url
    else:
        hub.close()  # nothing listens there any more
        endpoint = hub.url
    code, _out, err = pull(capsys)
    assert code == 2
    line = err.strip()
    assert "\n" not in line and line.startswith("memosight: ")
    path = cache / "models" / "tiny-test.gguf"
    assert str(path) in line and f"{endpoint}/{REPO}/resolve/{REVISION}/tiny-test.gguf" in line
    assert ("HF_HUB_OFFLINE" in line) if how == "HF_HUB_OFFLINE" else ("cannot reach" in line)
    assert not path.exists()
    if how == "HF_HUB_OFFLINE":
        assert hub.requests == []


def test_a_pulled_model_loads_by_its_name_and_the_config_keeps_the_name(hub, cache, capsys, tmp_path):
    with pytest.raises(ModelLoadError, match=f"memosight model pull {NAME}"):
        load_engine(NAME, device="cpu")
    assert pull(capsys)[0] == 0
    engine = load_engine(model=NAME, device="cpu")
    assert engine.complete("def add(a, b):\n    ret", "\n", single_line=True).stop_reason

    from memosight.server.config import ConfigSources

    workspace = tmp_path / "workspace"
    (workspace / NAME).mkdir(parents=True)  # a folder of that name in the project: still the catalog's
    (workspace / ".memosight.toml").write_text(f'model = "{NAME}"\n')
    sources = ConfigSources(root=workspace)
    assert sources.reload_file() == []
    assert sources.settings().engine.model == NAME
    catalog_name = "qwen2.5-coder-0.5b"
    (workspace / ".memosight.toml").write_text(f'model = "{catalog_name}"\ndraft_model = "{catalog_name}"\n')
    sources.reload_file()
    assert (sources.settings().engine.model, sources.settings().engine.draft_model) == (catalog_name, catalog_name)


def test_an_unknown_name_lists_the_known_ones(capsys):
    assert main(["model", "pull", "qwen2.5-coder-99b"]) == 2
    err = capsys.readouterr().err
    assert "qwen2.5-coder-0.5b" in err and "Traceback" not in err


def test_a_file_the_endpoint_does_not_have_is_one_clear_line(hub, cache, capsys):
    hub.file = "another.gguf"  # the endpoint answers 404 for the pinned file
    code, _out, err = pull(capsys)
    line = err.strip().splitlines()[-1]
    assert code == 2 and "refused" in line and "404" in line and str(cache / "models" / "tiny-test.gguf") in line
