"""What packing hands on: the text before and after the cursor, its size in model tokens, and the
regions of the files it was cut from (the shape `memosight context --json` prints)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Region:
    path: str
    start_line: int  # 1-based, inclusive
    end_line: int
    kind: str  # "cursor_prefix", "cursor_suffix", "function", "imports", ...
    score: float


@dataclass
class PackedContext:
    prefix: str
    suffix: str
    prompt_tokens: int
    regions: list[Region] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "prefix": self.prefix,
            "suffix": self.suffix,
            "prompt_tokens": self.prompt_tokens,
            "regions": [dict(r.__dict__) for r in self.regions],  # copies: the JSON is the caller's to change
        }
