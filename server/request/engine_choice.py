"""The engine the settings name (an EngineSpec: the engine package chooses and loads it with
`load_engine(spec)`); the defaults loaded instead when what they name fails; and the holder of the
loaded engine and of the engine thread every model run goes through."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

from memosight.engine.protocol import Engine, EngineSpec

from ..config import DEFAULT_ENGINE

Load = Callable[[EngineSpec], Engine]


def load(spec: EngineSpec) -> Engine:
    """The engine package's `load_engine(spec)`: the engine `spec` names: in-process, or a serving engine with the in-process one as its
    fallback (the engine package chooses; the server only describes). Torch is imported only here."""
    from memosight.engine import load_engine

    return load_engine(spec)


def load_with_fallback(load: Load, spec: EngineSpec, say: Callable[[str], None] | None) -> Engine:
    """Load what `spec` names; if that fails, `say` why and load the defaults for the model,
    device, dtype and runtime keys instead, so a bad value costs that key only (a bad draft model,
    the draft only). `say` None: no fallback, the failure is raised (a command-line run)."""
    try:
        return load(spec)
    except Exception as exc:
        if say is None:
            raise
        if spec.draft_model is not None:
            try:
                engine = load(dataclasses.replace(spec, draft_model=None))
            except Exception:  # noqa: BLE001 - the model itself is at fault too: the defaults below
                pass
            else:
                say(f"{exc}. Going on without the draft model.")
                return engine
        fallback = dataclasses.replace(DEFAULT_ENGINE, backend=spec.backend, workspace=spec.workspace)
        if fallback == spec:
            raise
        say(f"{exc}. Using the default model, device and dtype instead.")
        return load(fallback)


class EngineHolder:
    """The engine the settings name, loaded in the background on the engine thread, and that thread:
    model runs (loads, generations, warm-ups, prefetches) go through it one at a time, in order."""

    def __init__(self, load: Load, say: Callable[[str], None] | None):
        self._load = load
        self._say = say  # why the defaults were loaded instead; None: a failed load raises (a command)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memosight-engine")
        self._future: Future | None = None
        self._spec: EngineSpec | None = None
        self._queued: set[Future] = set()  # runs submitted and not done, the load included

    def ensure(self, spec: EngineSpec) -> tuple[Future, bool]:
        """(the load of the engine `spec` names, whether it starts now): unless it is loaded or
        loading already."""
        started = self._future is None or spec != self._spec or self._future.cancelled()
        if started:
            self._spec = spec
            self._future = self.submit(load_with_fallback, self._load, spec, self._say)
        return self._future, started

    def ready(self) -> Engine | None:
        """The engine, when it is loaded (and loaded without failing)."""
        f = self._future
        if f is not None and f.done() and not f.cancelled() and f.exception() is None:
            return f.result()
        return None

    def submit(self, fn, *args) -> Future:
        """Run `fn(*args)` on the engine thread, after what was asked of it before."""
        future = self._thread.submit(fn, *args)
        self._queued.add(future)
        future.add_done_callback(self._queued.discard)
        return future

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the run in progress (cancelled ones end within a step); whether
        the thread is idle now."""
        return not wait(list(self._queued), timeout).not_done

    def close(self, wait: bool) -> None:
        """No more runs. `wait`: wait for the thread and close the engine here (a command that exits
        next: a thread still in torch while the interpreter exits aborts the process); else close
        it on a thread of its own once the cancelled run lets go of it."""
        self._thread.shutdown(wait=wait, cancel_futures=True)
        engine = self.ready()
        self._future = None
        if engine is None:
            return
        if wait:
            engine.close()
        else:
            threading.Thread(target=engine.close, name="memosight-engine-close", daemon=True).start()
