"""llama.cpp's own `llama-server`, built natively for this CPU: the fair llama.cpp baseline.

The llama-cpp-python wheel pip builds decoded SmolLM2 Q4_1 at 4.7 tokens/s on a 2-core AVX2 EPYC,
far below llama.cpp compiled for the CPU it runs on, so `bench speculative` also runs the
llama-server that `build_llama_cpp.sh` builds from the pinned sources (cached per CPU). It is fed
the engine's own token ids over loopback HTTP (`/completion` with a token-array prompt, which gets
no BOS added), keeps its KV cache between requests (`cache_prompt`: a prompt that extends the last
evaluates only its new tokens) and decodes greedily (`top_k` alone, k = 1) on the thread count given.
Times are the client's wall clock, HTTP on loopback included (about a millisecond a request).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from ..loading.hardware import has_amx

log = logging.getLogger(__name__)
BUILD_SCRIPT = Path(__file__).with_name("build_llama_cpp.sh")


def native_bin_dir(build: bool = False) -> Path | None:
    """The folder holding the native llama-server: that of $MEMOSIGHT_LLAMA_SERVER (a llama-server
    binary), else the cached build for this CPU; `build`: build it when missing (~20 min on 2 cores)."""
    if os.environ.get("MEMOSIGHT_LLAMA_SERVER"):
        binary = Path(os.environ["MEMOSIGHT_LLAMA_SERVER"]).expanduser()
        return binary.parent if binary.is_file() else None
    args = ["bash", str(BUILD_SCRIPT)] + ([] if build else ["--check"])
    try:
        run = subprocess.run(args, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except OSError as exc:  # no bash here
        if build:
            raise RuntimeError(f"cannot run {BUILD_SCRIPT}: {exc}") from exc
        return None
    if run.returncode != 0:
        if build:
            raise RuntimeError(f"building llama.cpp failed: {run.stderr.strip()[-2000:]}")
        return None
    folder = Path(run.stdout.strip().splitlines()[-1])
    return folder if (folder / "llama-server").is_file() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def repack_flags(flags: frozenset[str] | None = None) -> list[str]:
    """llama-server's flags for this CPU: on one with AMX, `--no-repack`. llama.cpp 0c1e570's AMX
    repacking segfaults in ggml_backend_amx_mul_mat at the first decode (a 4th-gen Xeon, Qwen2.5-Coder
    Q4_K_M, native llama-server, seen with gdb); our own runtime never repacks (runtime/llamacpp.py)."""
    if has_amx(flags):
        log.info("llama-server: --no-repack (this CPU has AMX, whose repacking crashes llama.cpp 0c1e570)")
        return ["--no-repack"]
    return []


class LlamaServer:
    """A llama-server process on loopback, stopped by `close`."""

    def __init__(self, gguf: Path, threads: int | None, bin_dir: Path, n_ctx: int = 4096, start_timeout: float = 120.0,
                 extra: list[str] = ()):
        """`threads` None: llama-server's own default; n_ctx 0: the model's trained context;
        `extra`: more llama-server flags."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [str(bin_dir / "llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
                   "-c", str(n_ctx), "-np", "1", "--no-webui", *repack_flags(), *extra]
        if threads is not None:
            command += ["-t", str(threads), "-tb", str(threads)]
        # its log goes to a file: a pipe nobody reads fills up and stalls the server mid-request
        self.log = tempfile.TemporaryFile(mode="w+", prefix="llama-server-", suffix=".log")
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                        text=True)
        deadline = time.monotonic() + start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"llama-server exited at start: {self.log.read()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"llama-server did not come up on {self.url} within {start_timeout:.0f} s")

    def post(self, path: str, body: dict, timeout: float = 600.0) -> dict:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


class LlamaServerDecoder:
    """Greedy decoding in a native llama-server, as `bench speculative` runs each method."""

    def __init__(self, gguf: Path, threads: int, bin_dir: Path, spec_type: str | None = None):
        """`spec_type`: llama-server speculating by itself (`--spec-type ngram-mod`, ...)."""
        self.server = LlamaServer(gguf, threads, bin_dir, extra=["--spec-type", spec_type] if spec_type else [])

    def _completion(self, ids: list[int], n_predict: int) -> dict:
        return self.server.post("/completion", {
            "prompt": ids, "n_predict": n_predict, "cache_prompt": True, "return_tokens": True,
            "samplers": ["top_k"], "top_k": 1, "temperature": 0.0, "stream": False})

    def prefill(self, ids: list[int]) -> None:
        """The cache holding exactly `ids` (what a keystroke finds cached)."""
        if ids:
            self._completion(ids, 0)

    def generate(self, ids: list[int], max_new_tokens: int, eos_ids: set[int]) -> list[int]:
        """Greedy tokens after `ids`, ending at EOS (included) or the limit."""
        if max_new_tokens <= 0:
            return []
        tokens = [int(t) for t in self._completion(ids, max_new_tokens).get("tokens", [])]
        for n, token in enumerate(tokens):
            if token in eos_ids:
                return tokens[:n + 1]
        return tokens[:max_new_tokens]

    def close(self) -> None:
        self.server.close()
