"""memosight.engine: model loading, decoding and training. Never imports LSP types or tree-sitter.

torch is imported lazily so that `from memosight.engine import CompletionRequest` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .request import Completion, CompletionRequest, StopRule

if TYPE_CHECKING:
    from .loading import Engine, ModelLoadError


def load_engine(model: str | None = None, device: str | None = None, dtype: str | None = None) -> "Engine":
    """Load a causal LM and its tokenizer. model=None is the embedded default model;
    device=None picks CUDA when available, else the CPU."""
    from .loading import load_engine as _load

    return _load(model=model, device=device, dtype=dtype)


def __getattr__(name: str):
    if name in ("Engine", "ModelLoadError"):
        from . import loading

        return getattr(loading, name)
    raise AttributeError(name)


__all__ = ["load_engine", "Engine", "ModelLoadError", "CompletionRequest", "Completion", "StopRule"]
