"""Which runtime runs a model in process (EngineSpec.runtime), why, and the llama.cpp engine's load.

- "torch": transformers, always possible (a GGUF file is dequantized to float32 first: gguf.py).
- "llamacpp": the GGUF file as it is, on llama.cpp's kernels; a model that is not a GGUF file (the
  embedded model, a folder) is exported to one in the cache first (export_gguf.py: Llama models).
- "auto": on a CUDA GPU, torch. On a CPU, the runtimes whose load fits the memory bound (the GGUF
  file + its KV cache + 300 MB) are measured on one keystroke's completion and the faster is kept,
  once per CPU, build, model and thread count (runtime-choice.json in the cache folder), as dtype
  "auto" is. A quantized GGUF file leaves nothing to measure: torch's float32 copy is several times
  the file (Qwen2.5-Coder-0.5B: 491 MB against 3.3 GB loaded, issue 41), so llama.cpp runs it. A
  float32 file and the embedded model (exported once) are measured; a model folder runs on torch as
  it is, and so does a draft model or an explicit dtype. Where llama-cpp-python cannot be imported (not built: no
  compiler, another OS), torch, and the reason is given once.
"""
from __future__ import annotations

import hashlib
import logging
import os
import sys
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from ..protocol import EngineSpec, ModelLoadError

log = logging.getLogger(__name__)

RUNTIMES = ("auto", "torch", "llamacpp")
N_CTX = 4096  # the llama.cpp context: a 1,024-token prompt budget, 64 new tokens and a tree fit many times
KERNELS_METHOD = "3"  # changes when how the kernel classes are measured or used changes: measured again
CHOICE_METHOD = "1"  # changes when how the runtimes are compared changes: measured again
MEASURE = "measure"  # choose()'s answer when both runtimes fit and this machine has not compared them yet
HEADROOM_BYTES = 300 << 20  # issue 42's bound: the file + KV cache + 300 MB


@dataclass(frozen=True)
class RuntimeChoice:
    runtime: str  # "torch" or "llamacpp"
    why: str
    asked: str = "auto"

    def to_json(self) -> dict:
        return {"runtime": self.runtime, "why": self.why, "asked": self.asked}


def choose(spec: EngineSpec) -> RuntimeChoice:
    """The runtime for `spec`, or runtime MEASURE: compare both (measure_and_load) and keep the faster."""
    asked = spec.runtime or "auto"
    if asked not in RUNTIMES:
        raise ModelLoadError(f"unknown runtime {asked!r}: use one of {', '.join(RUNTIMES)}")
    if asked == "torch":
        return RuntimeChoice("torch", "asked for (runtime = \"torch\")", asked)
    from ..loading.gguf import gguf_file

    gguf = gguf_file(spec.model) if spec.model else None
    if asked == "llamacpp":
        _check_llamacpp_fits(spec)
        return RuntimeChoice("llamacpp", "asked for (runtime = \"llamacpp\")", asked)
    if spec.device not in (None, "auto", "cpu"):
        return RuntimeChoice("torch", f"device {spec.device!r}: the torch runtime runs on GPUs", asked)
    if spec.draft_model:
        return RuntimeChoice("torch", "a draft model runs beside the torch runtime only", asked)
    if spec.device in (None, "auto") and _cuda_available():
        return RuntimeChoice("torch", "a CUDA GPU: the torch runtime", asked)
    if gguf is None and spec.dtype not in (None, "auto", "float32"):
        return RuntimeChoice("torch", f"dtype {spec.dtype!r}: the torch runtime (llama.cpp runs the model "
                                      "exported in float32)", asked)
    if gguf is None and spec.model is not None:
        return RuntimeChoice("torch", "a model folder or hub name: the torch runtime runs it as it is", asked)
    reason = llamacpp_unavailable()
    if reason:
        return RuntimeChoice("torch", f"{reason}: the torch runtime instead" +
                             (" (it dequantizes the file: more memory, slower on a CPU)" if gguf else ""), asked)
    if gguf is not None and not _torch_fits(gguf):
        return RuntimeChoice("llamacpp", "a quantized GGUF file on a CPU: llama.cpp runs the file as it is (the "
                                         "torch runtime's float32 copy would not fit the file + KV cache + 300 MB)",
                             asked)
    from ..loading import measured

    known = measured.read(_choice_path()).get(_choice_key(spec))
    if isinstance(known, dict) and known.get("runtime") in ("torch", "llamacpp"):
        return RuntimeChoice(known["runtime"], f"{_compared(known)} on this CPU (measured before)", asked)
    return RuntimeChoice(MEASURE, "both runtimes fit: measure them", asked)


def measure_and_load(spec: EngineSpec, load_torch, load_llamacpp):
    """Loads the model on both runtimes, times one keystroke's completion on each (the best of 3, its
    prompt cached: what a keystroke costs while typing), keeps the faster engine and remembers which."""
    asked = spec.runtime or "auto"
    figures = {}
    engines = {}
    for runtime, load in (("torch", load_torch), ("llamacpp", load_llamacpp)):
        try:
            engines[runtime] = load(RuntimeChoice(runtime, "being measured"))
        except ModelLoadError as exc:
            if runtime == "torch":
                raise
            log.warning("runtime auto: llama.cpp could not load the model (%s); torch runs it", exc)
            engine = engines["torch"]
            engine.runtime_choice = RuntimeChoice("torch", f"llama.cpp could not load it: {exc}", asked).to_json()
            return engine
        figures[f"{runtime}_ms"] = round(_keystroke_ms(engines[runtime]), 2)
    winner = "llamacpp" if figures["llamacpp_ms"] < figures["torch_ms"] else "torch"
    engines.pop("torch" if winner == "llamacpp" else "llamacpp").close()
    known = {"runtime": winner, **figures}
    from ..loading import measured

    measured.remember(_choice_path(), _choice_key(spec), known)
    engine = engines[winner]
    engine.runtime_choice = RuntimeChoice(winner, f"{_compared(known)} on this CPU (measured now)", asked).to_json()
    log.info("runtime auto: %s", engine.runtime_choice["why"])
    return engine


def _compared(known: dict) -> str:
    return (f"{known['runtime']}: a keystroke's completion took {known.get('llamacpp_ms')} ms on llama.cpp, "
            f"{known.get('torch_ms')} ms on torch")


_KEYSTROKE_PROMPT = "def fill(text, width=70, **kwargs):\n    "


def _keystroke_ms(engine) -> float:
    """The best of 3 completions of one prompt after a first one that fills the cache, in ms."""
    prefix = _PROBE_TEXT * 4 + _KEYSTROKE_PROMPT
    engine.complete(prefix, max_new_tokens=24)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        engine.complete(prefix, max_new_tokens=24)
        best = min(best, (time.perf_counter() - started) * 1000)
    return best


def _torch_fits(path: Path) -> bool:
    """Whether torch's float32 copy of a GGUF file fits the bound llama.cpp's load meets (file + 300 MB;
    the KV cache is left out on both sides)."""
    from ..loading.gguf import tensor_elements

    try:
        elements = tensor_elements(path)
    except (ValueError, OSError, struct.error):  # not a GGUF file after all: llama.cpp's load says so, clearly
        return False
    return elements * 4 <= path.stat().st_size + HEADROOM_BYTES


def _choice_path() -> Path:
    from ..loading.files import cache_root

    return cache_root() / "runtime-choice.json"


def _choice_key(spec: EngineSpec) -> str:
    from .llamacpp import import_llama_cpp

    return _machine_key(CHOICE_METHOD, import_llama_cpp(), _model_stamp(spec.model), cpu_threads())


def _machine_key(method: str, L, stamp: str, threads: int) -> str:
    """Names a figure measured here: how it was measured, the CPU, the llama.cpp build, the model's
    files and the thread count; a change to any of them measures it again."""
    from ..loading.hardware import cpu_model_and_flags
    from .llamacpp import build_flags

    return "|".join([method, cpu_model_and_flags(), L.__version__, build_flags(L), stamp, str(threads)])


def _folder(model: str | None) -> Path:
    """A model folder on disk; the embedded model's without importing torch's loading."""
    if model is None:
        from ..models import DEFAULT_MODEL_DIR

        return DEFAULT_MODEL_DIR
    from ..loading.torch_load import _resolve

    source, local = _resolve(model)
    if not local:
        raise ModelLoadError(f"runtime \"llamacpp\" takes a GGUF file or a local model folder; {model!r} is neither")
    return Path(source)


def _model_stamp(model: str | None) -> str:
    """Names a model's files: a changed file is a new model."""
    from ..loading.gguf import gguf_file

    path = gguf_file(model) if model else None
    return _files_stamp(path if path is not None else _folder(model))


def _files_stamp(path: Path) -> str:
    """A file, or a folder's files, by name, size and modification time."""
    files = [path] if path.is_file() else sorted(f for f in path.glob("*") if f.is_file())
    return str(path.resolve()) + "|" + ",".join(f"{f.name}:{f.stat().st_size}:{int(f.stat().st_mtime)}"
                                                for f in files)


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
    # torch's import costs 1.5-2 s and ~200 MB: on Linux without NVIDIA's driver there is no CUDA to ask about
    if sys.platform.startswith("linux") and "torch" not in sys.modules \
            and not any(os.path.exists(p) for p in ("/proc/driver/nvidia/version", "/dev/nvidiactl")):
        return False
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
    from ..drafts.heads import HeadDrafter
    from ..engines.local import CpuDevice, LocalEngine
    from ..loading.gguf import gguf_file
    from .gguf_tokenizer import GgufTokenizer
    from .llamacpp import LlamaCppRuntime

    path = gguf_file(spec.model) if spec.model else None
    folder = None  # an exported model's folder: its tokenizer's split, FIM order and n-gram table
    if path is None:
        path, folder = exported_gguf(spec.model), _folder(spec.model)
    heads = _heads_folder(path, folder)
    runtime = LlamaCppRuntime(path, cpu_threads(), N_CTX, hidden=heads is not None)  # heads read hidden states
    splitter = folder / "tokenizer.json" if folder is not None else None  # gguf_tokenizer.py says why
    tokenizer = GgufTokenizer(runtime.L, runtime.vocab, splitter if splitter and splitter.is_file() else None)
    _kernel_classes(runtime, tokenizer.encode(_PROBE_TEXT * 8)[:320])  # past 256 cells, where kernels change
    name = "default" if spec.model is None else spec.model
    drafters = [d for d in [HeadDrafter.for_gguf(path, heads) if heads else None] if d is not None]
    engine = LocalEngine(None, tokenizer, CpuDevice(), name, str(folder) if folder else None, drafters,
                         runtime=runtime, runtime_choice=choice.to_json())
    engine.warm_up()
    log.info("loaded %s on llama.cpp (%s, %d threads; exact trees of up to %d nodes, decodes of %d rows at least)",
             path, runtime.weights_type, runtime.threads, runtime.exact_rows, runtime.min_rows)
    return engine


def _heads_folder(path: Path, folder: Path | None) -> Path | None:
    """The draft heads of a file on this runtime (trained on llama.cpp's hidden states); for a model
    exported from a folder in float32 (the embedded one), the folder's own heads: the exported
    file's hidden states are torch's, to float32 rounding."""
    from ..drafts.heads_files import gguf_heads_folder, heads_folder

    return gguf_heads_folder(path) or (heads_folder(folder) if folder is not None else None)


def _kernel_classes(runtime, probe: list[int]) -> None:
    """The runtime's exact kernel classes and what a pass of each size costs: measured once per CPU,
    llama.cpp build, file and thread count (~4 s for Qwen2.5-Coder-0.5B on 2 cores), then read from
    the cache folder."""
    from ..decoding.sizing import ROW_SIZES
    from ..loading import measured
    from ..loading.files import cache_root
    from . import llamacpp_kernels as kernels

    if len(probe) < 8:
        return
    key = _machine_key(KERNELS_METHOD, runtime.L, _files_stamp(runtime.path), runtime.threads)
    path = cache_root() / "llamacpp-kernels.json"
    known = measured.read(path).get(key)
    if isinstance(known, dict) and kernels.restore(runtime, known) and runtime.known_pass_ms:
        return
    if not runtime.kernel_classes:
        kernels.measure_kernel_classes(runtime, probe)
    # what a verification pass costs on this machine, for the tree sizer (~2 s for Qwen2.5-Coder-0.5B)
    kernels.measure_pass_costs(runtime, probe, ROW_SIZES)
    measured.remember(path, key, kernels.figures(runtime))


# Text of the standard library's kind (no model here was tuned on it) for the exactness probe.
_PROBE_TEXT = '''def wrap(text, width=70, **kwargs):
    """Wrap a single paragraph of text, returning a list of wrapped lines."""
    w = TextWrapper(width=width, **kwargs)
    return w.wrap(text)
'''


def exported_gguf(model: str | None) -> Path:
    """A model that is not a GGUF file (the embedded one, a folder) as one, written once into the
    cache by the project's exporter (float32; Llama models)."""
    from ..loading.files import cache_root

    source = _folder(model)
    digest = hashlib.sha256(_files_stamp(source).encode()).hexdigest()[:16]
    out = cache_root() / "gguf-exports" / f"{source.name}-{digest}.gguf"
    if not out.is_file():
        from ..loading.export_gguf import export_gguf
        from ..loading.torch_load import load_on_torch

        out.parent.mkdir(parents=True, exist_ok=True)
        staging = out.with_suffix(f".{os.getpid()}.tmp")
        try:
            export_gguf(load_on_torch(EngineSpec(model, device="cpu", dtype="float32")), staging)
        except (ValueError, KeyError, NotImplementedError) as exc:
            staging.unlink(missing_ok=True)
            raise ModelLoadError(f"{model or 'the embedded model'} could not be written as a GGUF file for llama.cpp "
                                 f"({exc}); set runtime = \"torch\"") from exc
        staging.replace(out)
    return out
