"""Token healing on two tokenizers: the embedded model's (whitespace runs kept whole, newline apart)
and a GPT-2-style one (the test tokenizer: a whitespace run before a word gives its last space to
the word), with cursors after indentation, after a space, inside an identifier and inside a string."""

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from memosight.engine import CompletionRequest, EngineSettings, StopRule, load_engine
from memosight.engine.text.healing import TokenBytes, back_up, last_word_chars
from transformers import AutoTokenizer

EMBEDDED = Path(__file__).parents[3] / "engine" / "models" / "default"

CURSORS = {
    "after indentation": "class A:\n    def f(self):\n        ",
    "deep indentation": "def f(x):\n    if x:\n        for y in x:\n            ",
    "after a space": "def total(items):\n    return ",
    "inside an identifier": "def total(items):\n    return sum(it",
    "inside a string": "print('hello wor",
}


@pytest.fixture(scope="module", params=["embedded", "gpt2-style"])
def tokenizer(request, tiny_model_dir):
    return AutoTokenizer.from_pretrained(EMBEDDED if request.param == "embedded" else tiny_model_dir)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def heal(tokenizer, pieces: TokenBytes, prefix: str) -> tuple[list[int], str]:
    return back_up(encode(tokenizer, prefix), pieces, last_word_chars(tokenizer, prefix))


def spell(pieces: TokenBytes, ids: list[int]) -> bytes:
    return b"".join(pieces.pieces[i] for i in ids)


def constraint_accepts(pieces: TokenBytes, healed: str, ids: list[int]) -> bool:
    """Whether tokens `ids` pass the healing constraint and spell all of `healed` on the way."""
    rest = healed.encode()
    for token in ids:
        if not rest:
            return True
        if token not in pieces.allowed(rest):
            return False
        rest = pieces.rest_after(rest, token)
    return not rest


@pytest.mark.parametrize("where", list(CURSORS))
def test_the_prompt_backs_up_to_a_token_boundary_before_the_cursor(tokenizer, where):
    pieces = TokenBytes.of(tokenizer)
    prefix = CURSORS[where]
    ids = encode(tokenizer, prefix)
    kept, healed = heal(tokenizer, pieces, prefix)
    assert kept == ids[:len(kept)] and 1 <= len(ids) - len(kept) <= 8
    assert healed and spell(pieces, kept).decode() + healed == prefix


@pytest.mark.parametrize("where, continuation", [
    ("after indentation", "return self.x\n"), ("deep indentation", "print(y)\n"),
    ("after a space", "sum(item.price for item in items)\n"), ("inside an identifier", "ems)\n"),
    ("inside a string", "ld')\n")])
def test_the_way_the_tokenizer_writes_the_line_passes_the_constraint(tokenizer, where, continuation):
    pieces = TokenBytes.of(tokenizer)
    kept, healed = heal(tokenizer, pieces, CURSORS[where])
    # What the model saw in training: the whole text tokenized at once. Its tokens after the kept
    # ones spell the healed text and go on; the constraint must allow exactly such tokens.
    whole = encode(tokenizer, CURSORS[where] + continuation)
    assert whole[:len(kept)] == kept
    assert constraint_accepts(pieces, healed, whole[len(kept):])


def test_gpt2_style_tokens_that_split_the_indentation_are_allowed(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    pieces = TokenBytes.of(tokenizer)
    indent = "\n" + " " * 12
    first = encode(tokenizer, indent + "return")[0]
    assert pieces.pieces[first] != indent.encode() and indent.encode().startswith(pieces.pieces[first])
    assert first in pieces.allowed(indent.encode())  # a prefix of the cut text: allowed, the constraint goes on
    assert pieces.rest_after(indent.encode(), first) == indent.encode()[len(pieces.pieces[first]):]


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("ab_ (\n\t'.:=1é")), min_size=1, max_size=30),
       more=st.text(alphabet=st.sampled_from(list("ab_ (\n'.=")), max_size=10))
def test_any_tokenization_of_the_text_after_the_boundary_passes_the_constraint(tiny_model_dir, text, more):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    pieces = TokenBytes.of(tokenizer)
    kept, healed = heal(tokenizer, pieces, text)
    assert spell(pieces, kept).decode() + healed == text
    rest = encode(tokenizer, healed + more)  # another tokenization of text that starts with the cut text
    assert constraint_accepts(pieces, healed, rest)


def test_healed_completions_are_the_same_with_and_without_speculation(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")

    def completions() -> list[str]:
        return [engine.stream(CompletionRequest(prefix, "\n", max_new_tokens=24, stop=StopRule())).result().text
                for prefix in CURSORS.values()]

    speculative = completions()
    engine.configure(EngineSettings(speculative=False))
    assert completions() == speculative


def test_the_suggestion_starts_at_the_cursor_and_typing_reuses_the_cache(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    prefix = "def total(items):\n    return sum(item.price for item in items)\n" * 12 + "def f(x):\n    ret"
    prompt, unhealed = engine.prompt(prefix, fim=False), engine.prompt(prefix, heal=False, fim=False)
    assert prompt.healed and prefix.endswith(prompt.healed) and not unhealed.healed
    assert unhealed.ids[:len(prompt.ids)] == prompt.ids and len(prompt.ids) < len(unhealed.ids)
    engine.stream(CompletionRequest(prefix, max_new_tokens=8)).result()
    typed = engine.stream(CompletionRequest(prefix + "u", max_new_tokens=8)).result()
    assert typed.prompt_tokens - typed.reused_tokens <= 3  # the backed-up prompt still extends the last one


@settings(max_examples=80, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("ab_ (\n\t'.:=12é")), min_size=1, max_size=40),
       more=st.text(alphabet=st.sampled_from(list("ab_ (\n'.=3")), min_size=1, max_size=10))
def test_the_kept_tokens_are_how_the_tokenizer_starts_the_text_typed_further(tiny_model_dir, text, more):
    # What makes the KV cache and the model's view agree: typing more never changes the kept tokens.
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    kept, _ = heal(tokenizer, TokenBytes.of(tokenizer), text)
    assert encode(tokenizer, text + more)[:len(kept)] == kept
