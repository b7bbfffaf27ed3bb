"""The plan of a keystroke's prefill: which cached runs the new prompt holds elsewhere, moved past
their first `recompute` tokens."""

from __future__ import annotations

from memosight.engine.runtime.moves import Move, Source, pieces, plan

PREFIX = list(range(100, 160))
SUFFIX = list(range(500, 580))  # <|fim_suffix|> and the text after the cursor, as token ids
MIDDLE = [9]


def test_typing_before_the_suffix_moves_it_past_its_first_tokens_and_computes_the_middle():
    old = PREFIX + [1, 2] + SUFFIX + MIDDLE + [77, 78]  # + what the last suggestion generated
    new = PREFIX + [1, 2, 3, 4, 5] + SUFFIX + MIDDLE
    moves = plan([Source(0, 0, old)], kept=62, new=new, recompute=16)
    assert moves == [Move(Source(0, 0, old), old_start=62 + 16, new_start=65 + 16, length=len(SUFFIX) - 16)]
    # the middle token matched too, but the last token is always computed
    assert moves[0].new_end == len(new) - 1 and moves[0].shift == 3
    assert pieces(moves, 62, len(new)) == [(62, 81, None), (81, len(new) - 1, moves[0]), (len(new) - 1, len(new), None)]


def test_a_deleted_character_moves_the_suffix_back():
    old = PREFIX + [1, 2, 3] + SUFFIX + MIDDLE
    new = PREFIX + [1, 2] + SUFFIX + MIDDLE
    [move] = plan([Source(0, 0, old)], kept=62, new=new, recompute=4)
    assert move.shift == -1 and move.old_start == 63 + 4


def test_runs_too_short_to_gain_are_computed_and_cells_before_the_kept_prefix_never_move():
    old = PREFIX + SUFFIX[:20] + MIDDLE
    new = PREFIX[:30] + [7] + SUFFIX[:20] + MIDDLE
    assert plan([Source(0, 0, old)], kept=30, new=new, recompute=16) == []  # 20 - 16 < min_gain
    # PREFIX[30:] sits in the cache before `kept`... only after it may cells move
    new = PREFIX[:10] + PREFIX[30:] + MIDDLE
    [move] = plan([Source(0, 0, old)], kept=10, new=new, recompute=4, min_gain=8)
    assert move.old_start == 30 + 4 and move.new_start == 10 + 4 and move.length == 30 - 4


def test_a_region_moved_ahead_and_the_suffix_behind_are_two_moves_each_cell_once():
    region = list(range(1000, 1040))
    old = PREFIX + region + [1] + SUFFIX + MIDDLE
    new = PREFIX[:5] + region + PREFIX[5:] + [1, 2] + SUFFIX + MIDDLE
    moves = plan([Source(0, 0, old)], kept=5, new=new, recompute=8)
    assert [(m.old_start, m.new_start) for m in moves] == [
        (60 + 8, 5 + 8), (5 + 8, 45 + 8), (101 + 8, 102 + 8)]
    taken = sorted((m.old_start, m.old_start + m.length) for m in moves)
    assert all(a[1] <= b[0] for a, b in zip(taken, taken[1:]))  # no cell moved twice
    assert all(m.new_end <= len(new) - 1 for m in moves)


def test_a_run_a_stopped_prefill_left_parked_is_found_in_its_own_sequence():
    parked = Source(20, 70, SUFFIX)  # parked at the positions the stopped prompt gave it
    new = PREFIX + [1, 2, 3] + SUFFIX + MIDDLE
    [move] = plan([Source(0, 0, PREFIX + [1]), parked], kept=61, new=new, recompute=16)
    assert move.source is parked and move.old_start == 70 + 16 and move.new_start == 63 + 16


def test_of_a_repeated_line_the_longest_run_is_taken():
    line = list(range(700, 720))
    old = PREFIX + [1] + line + [2] + line + MIDDLE
    new = PREFIX + [1, 5] + line + [2] + line + MIDDLE
    moves = plan([Source(0, 0, old)], kept=61, new=new, recompute=2, min_gain=4)
    assert [(m.shift, m.length) for m in moves] == [(1, 41 - 2)]  # both lines and what lies between, in one
