"""The code tokenizer: exact round trips, single-token FIM specials, compact indentation."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from memosight.engine.train.tokenizer import SPECIAL_TOKENS, load_tokenizer, round_trips, train_tokenizer

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SAMPLES = [(STDLIB / name).read_text() for name in ("textwrap.py", "heapq.py", "bisect.py", "shlex.py", "fnmatch.py")]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(SAMPLES * 2, vocab_size=1000).save_pretrained(folder)
    return load_tokenizer(folder)  # reloaded as the engine will: AutoTokenizer, offline


def test_every_sample_file_round_trips_exactly(tokenizer):
    odd = "x = 'café ☕'\r\n\tif a:\n\t\treturn  b  # trailing  \n\n\n\x0c\n"
    for text in [*SAMPLES, odd]:
        assert round_trips(tokenizer, text)


def test_special_tokens_are_single_tokens_with_fixed_ids(tokenizer):
    assert tokenizer.eos_token == tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS) == [0, 1, 2, 3, 4]
    ids = tokenizer.encode("<fim_prefix>def f(<fim_suffix>)\n<fim_middle>", add_special_tokens=False)
    assert ids[0] == 1 and 2 in ids and ids[-1] == 3


@pytest.mark.parametrize("width", [4, 8, 12])
def test_indentation_is_one_token(tokenizer, width):
    tokens = tokenizer.tokenize(" " * width + "return value")
    assert tokens[0] == "Ġ" * width and tokens[1] == "return"
