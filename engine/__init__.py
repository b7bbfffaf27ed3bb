"""memosight.engine: model loading, decoding and training. Never imports LSP types or tree-sitter.

torch is imported lazily, so that the server can import the protocol (and `load_engine`) cheaply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .protocol import (Completion, CompletionRequest, Engine, EngineError, EngineSettings, ModelLoadError,
                       RequestOptions, StopRule, Stream)

if TYPE_CHECKING:
    from .local import LocalEngine


def catalog_names() -> frozenset[str]:
    """The names `memosight model pull` knows (`model = "qwen2.5-coder-0.5b"`): names, not paths."""
    from .catalog import CATALOG  # no torch, no huggingface_hub

    return frozenset(CATALOG)


def load_engine(model: str | None = None, device: str | None = None, dtype: str | None = None,
                draft_model: str | None = None, *, backend: dict | None = None) -> "Engine":
    """Load a causal LM and its tokenizer into the in-process engine. model=None is the embedded
    default model; device=None picks CUDA when available, else the CPU. `draft_model`: a small model
    with the same tokenizer that drafts for speculative decoding (the output stays greedy's).

    `backend`: a serving engine to call instead, as the `backend` setting names it (kind, url, model,
    tokenizer, api_key_env, timeout_ms, first_token_timeout_ms, ca_bundle, workspace, and fallback:
    "local" loads the in-process engine above when the server is down or too slow, "none" does not).
    None, or kind "local", is the in-process engine."""
    from .loading import load_engine as _load

    def local() -> "LocalEngine":
        return _load(model=model, device=device, dtype=dtype, draft_model=draft_model)

    if not backend or backend.get("kind", "local") == "local":
        return local()
    import getpass

    from .remote import RemoteSettings, open_remote_engine, session_id

    fields = {k: v for k, v in backend.items() if k in RemoteSettings.__dataclass_fields__}
    if "workspace" in backend:  # a stable, anonymous id of (user, workspace) keeps a user on one replica
        fields["session_id"] = session_id(getpass.getuser(), str(backend["workspace"]))
    return open_remote_engine(RemoteSettings(**fields), fallback=local if backend.get("fallback") == "local" else None)


def __getattr__(name: str):
    if name == "LocalEngine":
        from .local import LocalEngine

        return LocalEngine
    raise AttributeError(name)


__all__ = ["load_engine", "Engine", "LocalEngine", "EngineError", "ModelLoadError", "EngineSettings",
           "CompletionRequest", "RequestOptions", "Completion", "StopRule", "Stream"]
