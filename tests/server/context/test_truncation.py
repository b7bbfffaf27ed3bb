"""Plain truncation around the cursor: whole lines, within the budget."""

from memosight.server.context.truncation import truncate_around_cursor

from .test_packing import WORDS


def test_truncation_baseline_keeps_whole_lines_around_the_cursor():
    text = "".join(f"x{i} = {i}\n" for i in range(100))
    cursor = text.index("x50")
    packed = truncate_around_cursor(text, cursor, 40, 0.25, WORDS)
    assert packed.prompt_tokens <= 40 and packed.prefix.endswith("x49 = 49\n") and packed.suffix.startswith("x50")
