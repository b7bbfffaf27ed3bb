"""Resolving and loading models: the embedded default, local folders and Hugging Face ids, on the
right device and dtype. `load_engine` wraps the result in the in-process engine."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch

from ..decoding import kv
from ..engines.local import LocalEngine
from ..models import DEFAULT_MODEL_DIR
from ..protocol import EngineSpec, ModelLoadError
from .auto_dtype import as_dtype, choose_cpu_dtype
from .files import cache_root
from .gguf import dequantized_folder, gguf_file
from .int8 import calibration_ids, quantize_int8
from .memory import give_back
from .threads import PrefillThreads

log = logging.getLogger(__name__)

# Models that ship inside the package, by the name a config uses for them.
PACKAGED_MODELS = {"smollm2-135m-draft": DEFAULT_MODEL_DIR.parent / "smollm2-135m-draft"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_model_dir() -> Path:
    return DEFAULT_MODEL_DIR


def pick_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} was asked for but CUDA is not available here; "
                             "set device = \"cpu\" or \"auto\"")
    try:
        return torch.device(device)
    except RuntimeError as exc:
        raise ModelLoadError(f"unknown device {device!r}: use \"auto\", \"cpu\" or \"cuda\"") from exc


def pick_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """The dtype the model is loaded in; for "int8", that of its activations (its linear layers'
    weights are then quantized: engine/loading/int8.py)."""
    if dtype in (None, "auto", "int8"):
        # float32 on a CPU: exact, and what "auto" measures the others against (auto_dtype.py); on a
        # GPU half precision halves the traffic.
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}: use one of auto, int8, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def cpu_threads(model) -> int:
    """Threads for CPU decoding. A small model decodes one token in well under a millisecond of math,
    so extra threads only add synchronisation, and when another process holds a core they wait on
    each other (measured here: 0.9 ms/token on 1 thread, 55 ms on 2 with the other core busy).
    MEMOSIGHT_THREADS overrides."""
    if os.environ.get("MEMOSIGHT_THREADS", "").isdigit():
        return max(1, int(os.environ["MEMOSIGHT_THREADS"]))
    params = sum(p.numel() for p in model.parameters())
    return 1 if params < 100_000_000 else max(1, (os.cpu_count() or 2) - 1)


def _resolve(model: str | None) -> tuple[str, bool]:
    """(what to pass to from_pretrained, whether it is a local folder)."""
    if model is None:
        if not (DEFAULT_MODEL_DIR / "config.json").is_file():
            raise ModelLoadError(
                f"the embedded default model is missing from {DEFAULT_MODEL_DIR}; reinstall memosight, "
                "or set model = \"/path/to/a/model/folder\" in .memosight.toml")
        return str(DEFAULT_MODEL_DIR), True
    if model in PACKAGED_MODELS:
        if not (PACKAGED_MODELS[model] / "config.json").is_file():
            raise ModelLoadError(f"the packaged model {model!r} is missing from {PACKAGED_MODELS[model]}; "
                                 "reinstall memosight")
        return str(PACKAGED_MODELS[model]), True
    gguf = gguf_file(model)
    if gguf is not None:
        return str(dequantized_folder(gguf)), True
    path = Path(model).expanduser()
    if path.exists() or model.startswith((".", "/", "~")) or os.sep + os.sep in model:
        if not path.is_dir():
            raise ModelLoadError(f"model folder {str(path)!r} does not exist; check the `model` setting "
                                 "(a folder with config.json, or a Hugging Face id such as 'org/name')")
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"model folder {str(path)!r} has no config.json; it must be a folder "
                                 "written by save_pretrained (config, weights and tokenizer)")
        return str(path), True
    return model, False


def model_folder(model: str | None) -> Path | None:
    """The local folder `load_on_torch` reads, where its draft files go (for a GGUF file, its
    dequantized copy in the cache); None for a Hugging Face id."""
    source, local = _resolve(model)
    return Path(source) if local else None


def _offline(local: bool) -> bool:
    """Whether to stay off the Hugging Face hub: a local folder, or HF_HUB_OFFLINE=1."""
    return local or os.environ.get("HF_HUB_OFFLINE") == "1"


def load_tokenizer(model: str | None = None):
    """Only the tokenizer of a model (the embedded one by default): for tools that count or
    tabulate tokens and need no weights."""
    from transformers import AutoTokenizer

    source, local = _resolve(model)
    try:
        return AutoTokenizer.from_pretrained(source, local_files_only=_offline(local))
    except (OSError, ValueError, json.JSONDecodeError, KeyError) as exc:
        raise ModelLoadError(f"the tokenizer of {source!r} could not be loaded ({exc}); point --model at a "
                             "folder written by save_pretrained, or a model in the Hugging Face cache") from exc


def _load_draft(draft_model: str, tokenizer, target: str, device: torch.device, dtype: torch.dtype,
                int8: bool = False):
    """The draft model as a draft source; it must spell tokens as the target does."""
    from ..drafts.model import DraftModel

    source, local = _resolve(draft_model)
    model, draft_tokenizer = _load_pretrained(source, local, dtype)
    if int8:
        quantize_int8(model.to(device), calibration=calibration_ids(draft_tokenizer))
    if draft_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ModelLoadError(f"draft model {draft_model!r} has another tokenizer than {target!r}; a draft model "
                             "must share the target's vocabulary (train one with `memosight train draft`)")
    if not kv.supports_reuse(model):  # its cache is cropped at every rejection
        raise ModelLoadError(f"draft model {draft_model!r} uses sliding-window attention, whose cache cannot be "
                             "cut back to the accepted text; choose a draft with full attention")
    if model.get_output_embeddings().weight.shape[0] > len(tokenizer):
        log.info("draft model %s has a padded output layer; ids past the vocabulary are never drafted", draft_model)
    return DraftModel(model.to(device), vocab_size=len(tokenizer))


PICKLED_WEIGHTS = {".bin", ".pt", ".pth", ".ckpt", ".pkl"}


def _load_pretrained(source: str, local: bool, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # progress bars would land in an editor's log

    offline = _offline(local)
    if local and not any(Path(source).glob("*.safetensors")) and any(
            p.suffix in PICKLED_WEIGHTS for p in Path(source).iterdir()):
        raise ModelLoadError(f"model folder {source!r} holds only pickled weights (.bin/.pt); MemoSight loads "
                             "weights only from .safetensors files, because loading a pickle can run code: "
                             "convert it (load it yourself, if you trust it, and save_pretrained it again)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=offline)
        # safetensors only: a pickle in a model folder a project names could run code; and never
        # trust_remote_code, so no Python file of a model folder is imported
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=offline,
                                                     use_safetensors=True, disable_mmap=read_whole(source))
    except (OSError, ValueError, json.JSONDecodeError, RuntimeError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if local:
            raise ModelLoadError(f"model folder {source!r} could not be loaded ({first}); it looks "
                                 "incomplete or corrupt: save it again with save_pretrained, or point "
                                 "`model` at another folder") from exc
        raise ModelLoadError(
            f"model {source!r} is not a folder on disk and could not be loaded from the Hugging Face "
            f"cache ({first}). Download it first where there is network (`hf download {source}`), or set "
            "`model` to a local folder") from exc
    return model, tokenizer


def read_whole(source: str) -> bool:
    """Whether to read a folder's weights into memory rather than map the files: for a dequantized
    GGUF in the cache (shards of SHARD_BYTES). Mapped, the pages each weight was read from stay
    resident beside the copies the lean decoder fuses from them: Qwen2.5-Coder-0.5B held 3.6 GB
    for 2.5 GB of weights. Read, a shard at a time, the originals are freed as they are fused."""
    return Path(source).is_relative_to(cache_root() / "gguf") and (Path(source) / "model.safetensors.index.json").is_file()


def _model_key(source: str, local: bool) -> str:
    """Names a model's weights for the per-machine dtype cache: a changed file is a new model."""
    if not local:
        return source
    files = sorted(Path(source).glob("*.safetensors"))
    return "|".join([str(Path(source).resolve())] + [f"{f.name}:{f.stat().st_size}:{int(f.stat().st_mtime)}"
                                                     for f in files])


def load_on_torch(spec: EngineSpec) -> LocalEngine:
    """The in-process engine on torch (transformers) for what `spec` names (its backend aside)."""
    model, device, dtype, draft_model = spec.model, spec.device, spec.dtype, spec.draft_model
    torch_device = pick_device(device)
    gpu_choice = None
    if dtype == "int8" and torch_device.type == "cuda":
        # int8 here is quantized matmuls for a CPU (int8.py): on a GPU they dequantize every weight on
        # every call (3-4x slower than float32 on an H200) and the static cache's graphs do not run them
        dtype = "auto"
        gpu_choice = {"asked": "int8", "dtype": str(pick_dtype(dtype, torch_device)).removeprefix("torch."),
                      "why": "int8 has no GPU kernel here: on a GPU bfloat16 is faster"}
        log.warning("dtype int8 asked for on %s: %s, loading %s", torch_device, gpu_choice["why"], gpu_choice["dtype"])
    torch_dtype = pick_dtype(dtype, torch_device)
    source, local = _resolve(model)
    hf_model, tokenizer = _load_pretrained(source, local, torch_dtype)
    hf_model.to(torch_device)
    if torch_device.type == "cpu":
        torch.set_num_threads(cpu_threads(hf_model))
    choice = None
    if dtype == "auto" and torch_device.type == "cpu":  # measured here, once per CPU and model
        choice = choose_cpu_dtype(hf_model, tokenizer, _model_key(source, local))
        dtype = choice.dtype
        torch_dtype = pick_dtype(dtype, torch_device)
        hf_model = as_dtype(hf_model, dtype, tokenizer)
        give_back()  # the candidates' memory, freed in pieces
    elif dtype == "int8":
        quantize_int8(hf_model, calibration=calibration_ids(tokenizer))
    name = "default" if model is None else model
    drafters = [_load_draft(draft_model, tokenizer, name, torch_device, torch_dtype, dtype == "int8")] \
        if draft_model else []
    log.info("loaded %s on %s (%s%s)%s", name, torch_device, torch_dtype, ", int8 weights" if dtype == "int8" else "",
             f", drafted by {draft_model}" if draft_model else "")
    engine = LocalEngine(hf_model, tokenizer, torch_device, name, source if local else None, drafters,
                         dtype_choice=choice.to_json() if choice else gpu_choice)
    engine.warm_up()
    if torch_device.type == "cpu" and not os.environ.get("MEMOSIGHT_THREADS"):
        engine.prompt_cache.prefill_threads = PrefillThreads((torch.get_num_threads(), os.cpu_count() or 1))
    return engine
