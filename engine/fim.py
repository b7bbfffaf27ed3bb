"""Fill-in-the-middle prompt templates, detected from the tokenizer's special tokens."""

from __future__ import annotations

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


PLAIN = FimTemplate("plain", None, None, None)

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


def render_ids(template: FimTemplate, encode, vocab: dict[str, int], prefix: str, suffix: str,
               bos_id: int | None = None, order: str = "psm") -> list[int]:
    """Prompt token ids: prefix/suffix/middle specials by id, user text encoded without specials,
    so text in a file that looks like a special token stays text.

    order "spm" (suffix first, for models trained on it) puts the prefix last: typing only extends
    the prompt's end, so the KV cache of everything before stays valid from keystroke to keystroke.
    """
    if not template.has_fim:
        return ([bos_id] if bos_id is not None else []) + encode(prefix)
    pre, suf, mid = (vocab[t] for t in (template.prefix_token, template.suffix_token, template.middle_token))
    lead = [bos_id] if bos_id is not None else []
    if template.space_after_prefix_token and order != "spm":
        prefix = " " + prefix
    return lead + arrange(pre, suf, mid, encode(prefix), encode(suffix), order)


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
