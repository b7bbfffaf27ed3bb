"""What `memosight bench typing` asks of each system it types into (memosight over LSP, memosight
on a llama-server backend, llama.vim's logic on llama-server): editor events in, the suggestion on
screen out. The typist runs on the real clock; a system answers in its own tasks meanwhile."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class SystemStats:
    """What a system reports after the typing: its requests and the CPU its model used."""

    requests: int = 0  # requests the system sent to its model (prefetches and warm-ups included)
    latencies_ms: list[float] = field(default_factory=list)  # edit -> suggestion on screen, per shown suggestion
    model_cpu_s: float = 0.0  # CPU seconds of the process that runs the model, over the typing
    notes: dict = field(default_factory=dict)  # anything system-specific worth printing (cache hits, ...)


class TypingSystem(Protocol):
    name: str

    async def start(self) -> None:
        """Start (the server, the client); return once it can take the first edit."""

    async def open(self, path: str, text: str, cursor: int) -> None:
        """The user opens (enters) `path`, whose buffer is `text`, with the cursor at offset `cursor`."""

    async def edit(self, text: str, cursor: int, inserted: str, accepted: bool) -> None:
        """`inserted` went in just before `cursor`: a typed key, or (accepted=True) a suggestion the
        user took with Tab. `text` is the whole buffer after it. The system may request a suggestion;
        it must return at once (requests run in the system's own tasks)."""

    def visible(self) -> str:
        """The suggestion on screen at the cursor now ("" for none): what the user can accept."""

    async def close(self, path: str) -> None:
        """The user leaves `path` (closes the buffer)."""

    async def stop(self) -> SystemStats:
        """Stop, and report."""
