"""Which runtime runs a model in process (EngineSpec.runtime), why, and the llama.cpp engine's load.

- "torch": transformers, always possible (a GGUF file is dequantized to float32 first: gguf.py).
- "llamacpp": the GGUF file as it is, on llama.cpp's kernels; a model that is not a GGUF file (the
  embedded model, a folder) is exported to one in the cache first (export_gguf.py: Llama models).
- "auto": on a CUDA GPU, torch. On a CPU, for a GGUF file, llama.cpp: its load is the file mapped
  plus its KV cache, while torch's dequantizes to float32 (Qwen2.5-Coder-0.5B: 491 MB against 3.3 GB
  loaded, issue 41), over the memory bound either runtime must meet (the file + KV + 300 MB), so
  there is nothing to measure between them. Anything else, torch. Where llama-cpp-python cannot be
  imported (not built: no compiler, another OS), torch, and the reason is given once.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from ..protocol import EngineSpec, ModelLoadError

log = logging.getLogger(__name__)

RUNTIMES = ("auto", "torch", "llamacpp")
N_CTX = 4096  # the llama.cpp context: a 1,024-token prompt budget, 64 new tokens and a tree fit many times
KERNELS_METHOD = "3"  # changes when how the kernel classes are measured or used changes: measured again


@dataclass(frozen=True)
class RuntimeChoice:
    runtime: str  # "torch" or "llamacpp"
    why: str
    asked: str = "auto"

    def to_json(self) -> dict:
        return {"runtime": self.runtime, "why": self.why, "asked": self.asked}


def choose(spec: EngineSpec) -> RuntimeChoice:
    asked = spec.runtime or "auto"
    if asked not in RUNTIMES:
        raise ModelLoadError(f"unknown runtime {asked!r}: use one of {', '.join(RUNTIMES)}")
    if asked == "torch":
        return RuntimeChoice("torch", "asked for (runtime = \"torch\")", asked)
    from ..gguf import gguf_file

    gguf = gguf_file(spec.model) if spec.model else None
    if asked == "llamacpp":
        _check_llamacpp_fits(spec)
        return RuntimeChoice("llamacpp", "asked for (runtime = \"llamacpp\")", asked)
    if spec.device not in (None, "auto", "cpu"):
        return RuntimeChoice("torch", f"device {spec.device!r}: the torch runtime runs on GPUs", asked)
    if gguf is None:
        return RuntimeChoice("torch", "not a GGUF file: the torch runtime runs it as it is", asked)
    if spec.draft_model:
        return RuntimeChoice("torch", "a draft model runs beside the torch runtime only", asked)
    if spec.device in (None, "auto") and _cuda_available():
        return RuntimeChoice("torch", "a CUDA GPU: the torch runtime", asked)
    reason = llamacpp_unavailable()
    if reason:
        return RuntimeChoice("torch", f"{reason}: the torch runtime dequantizes the file instead (more memory, "
                                      "slower on a CPU)", asked)
    return RuntimeChoice("llamacpp", "a GGUF file on a CPU: llama.cpp runs the file as it is (the torch runtime "
                                     "would dequantize it to float32, several times its memory)", asked)


def _check_llamacpp_fits(spec: EngineSpec) -> None:
    if spec.draft_model:
        raise ModelLoadError("a draft model runs beside the torch runtime only; remove `draft_model` or set "
                             "runtime = \"torch\"")
    if spec.device not in (None, "auto", "cpu"):
        raise ModelLoadError(f"runtime \"llamacpp\" runs on the CPU here; device {spec.device!r} wants runtime "
                             "\"torch\"")
    if reason := llamacpp_unavailable():
        raise ModelLoadError(f"runtime \"llamacpp\": {reason}; install it (pip install llama-cpp-python==0.3.36 builds "
                             "llama.cpp for this CPU, minutes) or set runtime = \"torch\"")


def llamacpp_unavailable() -> str | None:
    """Why llama-cpp-python cannot run here, or None when it can."""
    from .llamacpp import LlamaCppUnavailable, import_llama_cpp

    try:
        import_llama_cpp()
    except LlamaCppUnavailable as exc:
        return str(exc)
    return None


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def cpu_threads() -> int:
    """llama.cpp's threads: MEMOSIGHT_THREADS, else every core (llama-bench's figures here: 2 of 2)."""
    if os.environ.get("MEMOSIGHT_THREADS", "").isdigit():
        return max(1, int(os.environ["MEMOSIGHT_THREADS"]))
    return max(1, os.cpu_count() or 1)


def load_llamacpp_engine(spec: EngineSpec, choice: RuntimeChoice):
    """The in-process engine on llama.cpp: the runtime, the file's own tokenizer, no transformers."""
    import torch  # the engine's device type; no tensor of the model lives in torch

    from ..gguf import gguf_file
    from ..local import LocalEngine
    from .gguf_tokenizer import GgufTokenizer
    from .llamacpp import LlamaCppRuntime

    path = gguf_file(spec.model) if spec.model else None
    if path is None:
        path = exported_gguf(spec.model)
    runtime = LlamaCppRuntime(path, cpu_threads(), N_CTX)
    tokenizer = GgufTokenizer(runtime.L, runtime.vocab)
    _kernel_classes(runtime, tokenizer.encode(_PROBE_TEXT * 8)[:320])  # past 256 cells, where kernels change
    name = "default" if spec.model is None else spec.model
    engine = LocalEngine(None, tokenizer, torch.device("cpu"), name, None, runtime=runtime,
                         runtime_choice=choice.to_json())
    engine.warm_up()
    log.info("loaded %s on llama.cpp (%s, %d threads; exact trees of up to %d nodes, decodes of %d rows at least)",
             path, runtime.weights_type, runtime.threads, runtime.exact_rows, runtime.min_rows)
    return engine


def _kernel_classes(runtime, probe: list[int]) -> None:
    """The runtime's exact kernel classes: measured once per CPU, llama.cpp build, file and thread
    count (~2 s for Qwen2.5-Coder-0.5B on 2 cores), then read from the cache folder."""
    from .. import measured
    from ..gguf import cache_root
    from ..hardware import cpu_model_and_flags

    if len(probe) < 8:
        return
    stat = runtime.path.stat()
    key = "|".join([KERNELS_METHOD, cpu_model_and_flags(), runtime.L.__version__, runtime.build_flags(),
                    str(runtime.path.resolve()), str(stat.st_size),
                    str(int(stat.st_mtime)), str(runtime.threads)])
    path = cache_root() / "llamacpp-kernels.json"
    known = measured.read(path).get(key)
    if isinstance(known, dict) and runtime.restore_kernel_classes(known):
        return
    runtime.measure_kernel_classes(probe)
    measured.remember(path, key, runtime.kernel_figures())


# Text of the standard library's kind (no model here was tuned on it) for the exactness probe.
_PROBE_TEXT = '''def wrap(text, width=70, **kwargs):
    """Wrap a single paragraph of text, returning a list of wrapped lines."""
    w = TextWrapper(width=width, **kwargs)
    return w.wrap(text)
'''


def exported_gguf(model: str | None) -> Path:
    """A model that is not a GGUF file (the embedded one, a folder) as one, written once into the
    cache by the project's exporter (float32; Llama models)."""
    from ..gguf import cache_root
    from ..loading import _resolve, load_engine

    source, local = _resolve(model)
    if not local:
        raise ModelLoadError(f"runtime \"llamacpp\" takes a GGUF file or a local model folder; {model!r} is neither")
    stamp = "|".join(f"{f.name}:{f.stat().st_size}:{int(f.stat().st_mtime)}" for f in sorted(Path(source).glob("*")))
    digest = hashlib.sha256(f"{Path(source).resolve()}|{stamp}".encode()).hexdigest()[:16]
    out = cache_root() / "gguf-exports" / f"{Path(source).name}-{digest}.gguf"
    if not out.is_file():
        from ..export_gguf import export_gguf

        out.parent.mkdir(parents=True, exist_ok=True)
        staging = out.with_suffix(f".{os.getpid()}.tmp")
        try:
            export_gguf(load_engine(model, device="cpu", dtype="float32"), staging)
        except (ValueError, KeyError, NotImplementedError) as exc:
            staging.unlink(missing_ok=True)
            raise ModelLoadError(f"{model or 'the embedded model'} could not be written as a GGUF file for llama.cpp "
                                 f"({exc}); set runtime = \"torch\"") from exc
        staging.replace(out)
    return out
