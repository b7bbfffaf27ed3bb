"""memosight.engine: model loading, decoding and training. Never imports LSP types or tree-sitter.

torch is imported lazily, so that the server can import the protocol (and `load_engine`) cheaply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .protocol import (Completion, CompletionRequest, Engine, EngineError, EngineSettings, ModelLoadError,
                       RequestOptions, StopRule, Stream)

if TYPE_CHECKING:
    from .local import LocalEngine


def load_engine(model: str | None = None, device: str | None = None, dtype: str | None = None,
                draft_model: str | None = None) -> "LocalEngine":
    """Load a causal LM and its tokenizer into the in-process engine. model=None is the embedded
    default model; device=None picks CUDA when available, else the CPU. `draft_model`: a small model
    with the same tokenizer that drafts for speculative decoding (the output stays greedy's)."""
    from .loading import load_engine as _load

    return _load(model=model, device=device, dtype=dtype, draft_model=draft_model)


def __getattr__(name: str):
    if name == "LocalEngine":
        from .local import LocalEngine

        return LocalEngine
    raise AttributeError(name)


__all__ = ["load_engine", "Engine", "LocalEngine", "EngineError", "ModelLoadError", "EngineSettings",
           "CompletionRequest", "RequestOptions", "Completion", "StopRule", "Stream"]
