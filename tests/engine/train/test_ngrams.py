"""Counting the n-gram draft table from a corpus: the token stream it counts (each training file
then an end token), the continuations it then proposes, the held-out split, and the distilled table
(the model's greedy choices over windows spread along the stream)."""

import numpy as np
import pytest
import torch
from memosight.engine import load_engine
from memosight.engine.drafts.ngram import NgramTable
from memosight.engine.loading.torch_load import load_tokenizer
from memosight.engine.protocol import EngineError
from memosight.engine.train.ngrams import count_ngrams, greedy_choices

LINE = "total = compute_sum(values, start)\n"


@pytest.fixture
def repetitive_corpus(tmp_path):
    """Two files of one repeated line: every context in them has one known continuation."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.py").write_text(LINE * 12)
    (corpus / "b.py").write_text(LINE * 8)
    (corpus / "notes.txt").write_text(LINE * 50)  # not Python: not counted
    return corpus


def test_the_table_proposes_what_followed_each_context_in_the_corpus(tiny_model_dir, repetitive_corpus):
    count = count_ngrams(str(tiny_model_dir), [str(repetitive_corpus)], val_fraction=0.0, max_order=3, min_count=2)
    tokenizer = load_tokenizer(str(tiny_model_dir))
    line = tokenizer.encode(LINE * 3, add_special_tokens=False)
    period = len(tokenizer.encode(LINE, add_special_tokens=False))
    assert line[:period] == line[period:2 * period] == line[2 * period:]  # the line is the same tokens every time
    for i in range(period, 3 * period - 1):  # inside the line, whatever the tail: the token that came next
        assert count.table.guess(line[:i + 1])[0] == line[i + 1], i
    # after the line's newline the line starts again 18 times in 20 (twice a file ends)
    assert count.table.guess(line[:period]) == (line[0], 0.9)
    equals = tokenizer.encode(" =", add_special_tokens=False)
    assert count.table.guess(equals) == (line[line.index(equals[-1]) + 1], 1.0)  # " =" always before the call
    assert count.files == 2 and not count.distilled and count.seconds > 0


def test_the_stream_is_each_training_file_then_the_end_token(tiny_model_dir, repetitive_corpus):
    count = count_ngrams(str(tiny_model_dir), [str(repetitive_corpus)], val_fraction=0.0, max_order=3, min_count=1)
    tokenizer = load_tokenizer(str(tiny_model_dir))
    end = tokenizer.eos_token_id
    stream = [t for name in ("a.py", "b.py")
              for t in (*tokenizer.encode((repetitive_corpus / name).read_text(), add_special_tokens=False), end)]
    assert count.positions == len(stream)
    expected = NgramTable.build(np.array(stream), max_order=3, min_count=1)
    assert len(count.table) == len(expected)
    for i in range(len(stream) - 1):
        assert count.table.guess(stream[:i + 1]) == expected.guess(stream[:i + 1])
    # after the end token of a.py comes the first token of b.py
    a_tail = tokenizer.encode(LINE * 12, add_special_tokens=False)[-3:]
    assert count.table.guess([*a_tail, end])[0] == stream[stream.index(end) + 1]


def test_held_out_files_are_not_counted_and_an_empty_split_is_an_error(tiny_model_dir, repetitive_corpus, tmp_path):
    with pytest.raises(EngineError, match="corpus is empty"):
        count_ngrams(str(tiny_model_dir), [str(repetitive_corpus)], val_fraction=1.0)  # every file held out
    (tmp_path / "empty").mkdir()
    with pytest.raises(EngineError, match="corpus is empty"):
        count_ngrams(str(tiny_model_dir), [str(tmp_path / "empty")])
    with pytest.raises(EngineError, match="corpus folder not found"):
        count_ngrams(str(tiny_model_dir), [str(tmp_path / "missing")])


def test_greedy_choices_are_the_models_next_tokens_over_evenly_spread_windows(tiny_model_dir):
    tokens = np.arange(100, dtype=np.int64)
    seen = []
    windows, choices = greedy_choices(str(tiny_model_dir), "cpu", tokens, budget=48, window=16,
                                      progress=lambda done, total, figures: seen.append((done, total)))
    # windows start every 16 tokens (0..80); a budget of 3 windows takes every second one
    assert windows.tolist() == [*range(0, 16), *range(32, 48), *range(64, 80)]
    assert seen == [(1, 3), (2, 3), (3, 3)]
    model = load_engine(str(tiny_model_dir), device="cpu", dtype="float32").model
    with torch.inference_mode():
        for w in range(3):
            piece = torch.tensor([windows[w * 16:(w + 1) * 16].tolist()])
            assert choices[w * 16:(w + 1) * 16].tolist() == model(input_ids=piece).logits[0].argmax(-1).tolist()


def test_greedy_choices_take_one_window_at_least_and_a_short_stream_whole(tiny_model_dir):
    tokens = np.arange(100, dtype=np.int64)
    windows, choices = greedy_choices(str(tiny_model_dir), "cpu", tokens, budget=5, window=16)
    assert windows.tolist() == list(range(16)) and len(choices) == 16
    windows, choices = greedy_choices(str(tiny_model_dir), "cpu", tokens[:10], budget=1000)
    assert windows.tolist() == list(range(10)) and len(choices) == 10


def test_a_distilled_table_counts_the_models_choices_not_the_corpus(repeater_model_dir, repetitive_corpus):
    count = count_ngrams(str(repeater_model_dir), [str(repetitive_corpus)], val_fraction=0.0, min_count=1,
                         distill_tokens=300)
    tokenizer = load_tokenizer(str(repeater_model_dir))
    (x,) = tokenizer.encode("x")
    assert count.distilled
    stream = sum(len(tokenizer.encode((repetitive_corpus / n).read_text())) + 1 for n in ("a.py", "b.py"))
    assert count.positions == stream  # shorter than one window: the whole stream
    context = tokenizer.encode(LINE, add_special_tokens=False)
    assert count.table.guess(context) == (x, 1.0)  # the repeater writes "x" after anything
