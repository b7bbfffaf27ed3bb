"""A byte-level BPE tokenizer for source code, trained with the `tokenizers` library.

Pre-tokenization keeps code structure compact: an identifier or a punctuation run takes at most
one leading space (` foo`, ` =`), and any other run of spaces or tabs stays whole, so the usual
indentation widths (4, 8, 12 ... spaces) each become a single learned token. Byte-level encoding
with the full 256-byte alphabet means every UTF-8 text round-trips exactly.

Special tokens (ids 0..4, in this order): `<|endoftext|>` (EOS and padding), and the
StarCoder-style FIM markers `<fim_prefix>`, `<fim_suffix>`, `<fim_middle>`, `<file_sep>`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

EOS = "<|endoftext|>"
FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE, FILE_SEP = "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>"
SPECIAL_TOKENS = [EOS, FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE, FILE_SEP]

# Alternatives are tried left to right at each position: a word, a number (<= 3 digits), a
# punctuation run (each with one optional leading space), newlines, then a whole run of blanks.
# A blank run followed by a word is therefore kept whole (indentation), never split into
# "n-1 spaces" + " word" as in GPT-2.
PRETOKENIZE_PATTERN = (
    r" ?[\p{L}_][\p{L}\p{N}_]*"
    r"| ?\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}_]+"
    r"|[\r\n]+"
    r"|[ \t]+"
    r"|\s+"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 12_288, min_frequency: int = 2):
    """Train the BPE model on `texts`; returns a transformers PreTrainedTokenizerFast."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return wrap_tokenizer(tokenizer)


def wrap_tokenizer(tokenizer):
    """A `tokenizers.Tokenizer` -> transformers fast tokenizer with EOS/PAD and the FIM specials."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS,
        pad_token=EOS,
        additional_special_tokens=SPECIAL_TOKENS[1:],
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )


def save_tokenizer(tokenizer, out_dir: str | Path) -> None:
    tokenizer.save_pretrained(str(out_dir))


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def round_trips(tokenizer, text: str) -> bool:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) == text
