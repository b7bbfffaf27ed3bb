"""The engine the settings name, described to the engine package, which chooses and loads it; and
the defaults loaded instead when what they name fails."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from memosight.engine.protocol import Engine

from .config import Settings


def load_engine_from_settings(settings: Settings, workspace: str = "") -> Engine:
    """The engine the settings name: in-process, or a serving engine with the in-process one as its
    fallback (the engine package chooses; the server only describes)."""
    from memosight.engine import load_engine

    return load_engine(settings.engine_spec(workspace))


def load_with_fallback(load: Callable[[Settings], Engine], settings: Settings,
                       say: Callable[[str], None] | None) -> Engine:
    """Load what `settings` name; if that fails, `say` why and load the defaults for the model,
    device and dtype keys instead, so a bad value costs that key only (a bad draft model, the draft
    only). `say` None: no fallback, the failure is raised (a command-line run)."""
    try:
        return load(settings)
    except Exception as exc:
        if say is None:
            raise
        if settings.draft_model is not None:
            try:
                engine = load(dataclasses.replace(settings, draft_model=None))
            except Exception:  # noqa: BLE001 - the model itself is at fault too: the defaults below
                pass
            else:
                say(f"{exc}. Going on without the draft model.")
                return engine
        defaults = Settings()
        fallback = dataclasses.replace(settings, model=defaults.model, draft_model=defaults.draft_model,
                                       device=defaults.device, dtype=defaults.dtype)
        if fallback == settings:
            raise
        say(f"{exc}. Using the default model, device and dtype instead.")
        return load(fallback)
