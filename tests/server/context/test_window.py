"""llama.vim's context as a baseline: 256 lines before the cursor and 64 after, and other files' chunks."""

from memosight.server.context.window import CHUNK_LINES, chunk_of, window, window_with_chunks

TEXT = "\n".join(f"line {i}" for i in range(1000)) + "\n"
CURSOR = TEXT.index("line 500") + 3


def words(text: str) -> int:
    return len(text.split())


def test_the_window_is_256_lines_before_and_64_after_when_the_budget_allows():
    context = window(TEXT, CURSOR, 10_000, words, fim=True)
    assert context.prefix.endswith("lin") and context.prefix.startswith("line 245\n")
    assert context.suffix.startswith("e 500\n") and context.suffix.count("\n") == 64


def test_a_smaller_budget_cuts_the_far_ends_in_the_4_to_1_ratio():
    context = window(TEXT, CURSOR, 100, words, fim=True)
    assert context.prompt_tokens <= 100
    assert words(context.suffix) == 20 and words(context.prefix) >= 75  # whole lines: a word or two spare
    assert window(TEXT, CURSOR, 100, words, fim=False).suffix == ""  # no FIM tokens: the lines before only


def test_chunks_of_other_files_come_first_newest_nearest_and_the_total_stays_within_budget():
    chunks = [("/p/old.py", chunk_of(TEXT, 10)), ("/p/new.py", chunk_of(TEXT, 900))]
    assert chunk_of(TEXT, 900).count("\n") == CHUNK_LINES
    context = window_with_chunks(TEXT, CURSOR, 400, words, True, chunks, "#", "/p/here.py")
    assert context.prompt_tokens <= 400
    assert context.prefix.index("# file: old.py") < context.prefix.index("# file: new.py") \
        < context.prefix.index("# file: here.py")
    assert context.prefix.endswith("lin") and [r.kind for r in context.regions][:2] == ["other_files", "other_files"]
    small = window_with_chunks(TEXT, CURSOR, 100, words, True, chunks, "#", "/p/here.py")
    assert small.prompt_tokens <= 100 and "# file: new.py" in small.prefix and "old.py" not in small.prefix
