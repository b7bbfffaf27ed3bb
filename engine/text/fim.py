"""Fill-in-the-middle prompt templates, detected from the tokenizer's special tokens."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class FimTemplate:
    name: str
    prefix_token: str | None  # None: the model has no FIM, the prompt is the plain prefix
    suffix_token: str | None
    middle_token: str | None
    end_tokens: tuple[str, ...] = ()  # tokens that end the middle besides EOS
    space_after_prefix_token: bool = False  # CodeLlama's template puts a space after <PRE>

    @property
    def has_fim(self) -> bool:
        return self.prefix_token is not None


# A model without FIM tokens: the prompt is the text before the cursor; a document boundary ends it.
PLAIN = FimTemplate("plain", None, None, None, ("<|endoftext|>",))


@dataclass(frozen=True)
class Prompt:
    ids: list[int]  # the prompt's token ids
    healed: str = ""  # text cut from the end of the prefix (token healing): generation spells it first

# Checked in order; the first whose three tokens are all in the vocabulary wins.
TEMPLATES = (
    FimTemplate("starcoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>",
                ("<|endoftext|>", "<file_sep>", "<fim_pad>", "<fim_prefix>", "<fim_suffix>")),
    FimTemplate("qwen", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
                ("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<|im_end|>", "<|fim_prefix|>")),
    FimTemplate("deepseek", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", ("<｜end▁of▁sentence｜>", "<|EOT|>")),
    FimTemplate("codellama", "▁<PRE>", "▁<SUF>", "▁<MID>", ("▁<EOT>", "<EOT>"), space_after_prefix_token=True),
    FimTemplate("codellama", "<PRE>", "<SUF>", "<MID>", ("<EOT>",), space_after_prefix_token=True),
)


def detect_template(vocab: dict[str, int]) -> FimTemplate:
    for template in TEMPLATES:
        if all(t in vocab for t in (template.prefix_token, template.suffix_token, template.middle_token)):
            return template
    return PLAIN


def render(template: FimTemplate, encode: Callable[[str], list[int]], vocab: dict[str, int], prefix: str,
           suffix: str, bos_id: int | None = None, order: str = "psm",
           heal: Callable[[str, list[int]], tuple[list[int], str]] | None = None) -> Prompt:
    """The prompt: prefix/suffix/middle specials by id, user text encoded without specials, so text
    in a file that looks like a special token stays text. `heal` backs the encoded prefix up to a
    token boundary (`heal(prefix, prefix_ids)`, see healing.py); the text it cut is generated first,
    after the middle token.

    order "spm" (suffix first, for models trained on it) puts the prefix last: typing only extends
    the prompt's end, so the KV cache of everything before stays valid from keystroke to keystroke.
    """
    if template.has_fim and template.space_after_prefix_token and order != "spm":
        prefix = " " + prefix
    prefix_ids, healed = encode(prefix), ""
    if heal is not None and prefix_ids:
        prefix_ids, healed = heal(prefix, prefix_ids)
    lead = [bos_id] if bos_id is not None else []
    if not template.has_fim:
        return Prompt(lead + prefix_ids, healed)
    pre, suf, mid = (vocab[t] for t in (template.prefix_token, template.suffix_token, template.middle_token))
    return Prompt(lead + arrange(pre, suf, mid, prefix_ids, encode(suffix), order), healed)


def render_ids(template: FimTemplate, encode: Callable[[str], list[int]], vocab: dict[str, int], prefix: str,
               suffix: str, bos_id: int | None = None, order: str = "psm") -> list[int]:
    """The prompt's ids, not healed: it ends exactly at the cursor."""
    return render(template, encode, vocab, prefix, suffix, bos_id, order).ids


def arrange(pre: int, suf: int, mid: int, prefix_ids: list[int], suffix_ids: list[int],
            order: str = "psm") -> list[int]:
    """The FIM prompt from encoded parts: PSM `<PRE>{prefix}<SUF>{suffix}<MID>`, or StarCoder's SPM
    `<PRE><SUF>{suffix}<MID>{prefix}`, where the middle continues the prefix directly."""
    if order == "spm":
        return [pre, suf, *suffix_ids, mid, *prefix_ids]
    return [pre, *prefix_ids, suf, *suffix_ids, mid]


def read_model_options(folder) -> dict:
    """memosight.json beside a model: how it was trained to be prompted, e.g. {"fim_order": "spm"}."""
    import json
    from pathlib import Path

    path = Path(folder) / "memosight.json" if folder else None
    if path is None or not path.is_file():
        return {}
    try:
        options = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return options if isinstance(options, dict) else {}


def end_token_ids(template: FimTemplate, vocab: dict[str, int]) -> set[int]:
    return {vocab[t] for t in template.end_tokens if t in vocab}
