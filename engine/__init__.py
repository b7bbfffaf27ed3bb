"""memosight.engine: model loading, decoding and training. Never imports LSP types or tree-sitter.

torch is imported lazily, so that the server can import the protocol (and `load_engine`) cheaply.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from .loading import catalog  # the model catalog: names, pinned files, `pull` (no torch, no huggingface_hub)
from .protocol import (BackendSpec, Completion, CompletionRequest, Engine, EngineError, EngineInfo, EngineSettings,
                        EngineSpec, ModelLoadError, RequestOptions, StopRule, Stream)

if TYPE_CHECKING:
    from .engines.local import LocalEngine


def catalog_names() -> frozenset[str]:
    """The names `memosight model pull` knows (`model = "qwen2.5-coder-0.5b"`): names, not paths."""
    return frozenset(catalog.CATALOG)


def load_engine(model: "str | EngineSpec | None" = None, device: str | None = None, dtype: str | None = None,
                draft_model: str | None = None, runtime: str | None = None) -> "Engine":
    """Load a causal LM and its tokenizer into the in-process engine. model=None is the embedded
    default model; device=None picks CUDA when available, else the CPU. `draft_model`: a small model
    with the same tokenizer that drafts for speculative decoding (the output stays greedy's).

    `model` may be an EngineSpec instead, naming all of that and `backend`: a serving engine to
    call (fallback "local" loads the in-process engine above when the server is down or too slow,
    "none" does not); keywords given beside a spec override its fields. `runtime`: what runs the
    model ("auto", "torch", "llamacpp"; see runtime/choice.py)."""
    spec = model if isinstance(model, EngineSpec) else EngineSpec(model)
    overrides = {k: v for k, v in (("device", device), ("dtype", dtype), ("draft_model", draft_model),
                                   ("runtime", runtime)) if v is not None}
    spec = dataclasses.replace(spec, **overrides) if overrides else spec
    def local() -> "LocalEngine":
        from .runtime.choice import MEASURE, choose, load_llamacpp_engine, measure_and_load

        def on_torch(choice) -> "LocalEngine":
            from .loading.torch_load import load_on_torch

            engine = load_on_torch(spec)
            engine.runtime_choice = choice.to_json()
            return engine

        choice = choose(spec)
        if choice.runtime == MEASURE:
            return measure_and_load(spec, on_torch, lambda choice: load_llamacpp_engine(spec, choice))
        if choice.runtime == "llamacpp":  # no transformers on this path: loading.py is torch's
            return load_llamacpp_engine(spec, choice)
        return on_torch(choice)

    if not spec.backend.remote:
        return local()
    import getpass

    from .engines.remote import open_remote_engine, session_id

    # a stable, anonymous id of (user, workspace) keeps a user on one replica
    session = session_id(getpass.getuser(), spec.workspace) if spec.workspace else ""
    return open_remote_engine(spec.backend, fallback=local if spec.backend.fallback == "local" else None,
                              session_id=session)


def fault_injector(spec: str) -> "Callable[[Engine], Engine]":
    """For reliability tests only: a function that puts an engine behind one that fails or stalls on
    purpose by `spec` (e.g. 'raise=0.05,slow=0.05,slow_ms=400,seed=0'; faults.py). A bad spec raises
    ValueError at once, before any engine is loaded."""
    from .engines.faults import FaultPlan, FaultyEngine

    plan = FaultPlan.parse(spec)
    return lambda engine: FaultyEngine(engine, plan)


def __getattr__(name: str):
    if name == "LocalEngine":
        from .engines.local import LocalEngine

        return LocalEngine
    raise AttributeError(name)


__all__ = ["load_engine", "catalog", "Engine", "EngineSpec", "BackendSpec", "EngineInfo", "LocalEngine", "EngineError",
           "ModelLoadError", "EngineSettings",
           "CompletionRequest", "RequestOptions", "Completion", "StopRule", "Stream"]
