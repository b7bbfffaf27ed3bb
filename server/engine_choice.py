"""The engine the settings name, described to the engine package, which chooses and loads it."""

from __future__ import annotations

from memosight.engine.protocol import Engine

from .config import Settings


def load_engine_from_settings(settings: Settings, workspace: str = "") -> Engine:
    """The engine the settings name: in-process, or a serving engine with the in-process one as its
    fallback (the engine package chooses; the server only describes)."""
    from memosight.engine import load_engine

    b = settings.backend
    backend = None
    if b.remote:
        backend = {"kind": b.kind, "url": b.url, "model": b.model, "tokenizer": b.tokenizer,
                   "api_key_env": b.api_key_env, "timeout_ms": b.timeout_ms,
                   "first_token_timeout_ms": b.first_token_timeout_ms, "ca_bundle": b.ca_bundle,
                   "workspace": workspace, "fallback": b.fallback}
    return load_engine(settings.model, device=settings.device, dtype=settings.dtype,
                       draft_model=settings.draft_model, backend=backend)
