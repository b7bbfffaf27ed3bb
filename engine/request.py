"""The records that cross the one door between the server and the engine (no torch here)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StopRule:
    """Where a completion must end, besides EOS and the token limit."""

    single_line: bool = False  # stop at the first newline (the newline is not part of the text)
    suffix_line: str = ""  # the rest of the cursor's line: never generate it again
    next_suffix_line: str = ""  # the first non-blank line after the cursor: stop before repeating it
    stop_strings: tuple[str, ...] = ()  # extra strings that end the completion (not included)
    block_indent: int = -1  # multi-line: a later non-blank line indented this much or less ends the block
    # Multi-line: once this many milliseconds have passed since the request started, end at the last
    # complete line (0 = no budget). A shorter suggestion now beats a longer one late.
    time_budget_ms: float = 0.0


@dataclass
class CompletionRequest:
    prefix: str
    suffix: str = ""
    language: str = ""
    max_new_tokens: int = 64
    stop: StopRule = field(default_factory=StopRule)
    # Set by the server when the request is superseded or cancelled; checked between decode steps.
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass
class Completion:
    """What one request produced, with the figures the status and benchmarks report."""

    text: str
    tokens: int  # new tokens generated (including any cut by the stop rules)
    prompt_tokens: int
    latency_ms: float  # request start to last token
    first_token_ms: float
    # "eos" | "max_tokens" | "newline" | "suffix" | "stop_string" | "block_end" | "cancelled" | "time_budget"
    stop_reason: str
    reused_tokens: int = 0  # prompt tokens served from the KV cache instead of prefilled
