"""Where each replayed request's milliseconds went (replay_breakdown.py): the server's stages matched
to the client's latency, the figures worked out by hand on three requests, the text table, and the
plot."""

from __future__ import annotations

import sys

import pytest
from memosight.server.bench.replay_breakdown import breakdown, plot_breakdowns, prefill_per_keystroke
from memosight.server.commands.bench_replay import render_breakdown
from memosight.server.commands.common import CommandError


def recent() -> list[dict]:
    """memosight/status's recent requests; steps are (drafted, accepted, _, ms)."""
    return [
        {"id": 1, "kind": "typed", "total_ms": 8.0, "stages_ms": {"context": 2.0, "decode": 6.0},
         "steps": [[3, 2, 0, 1.5], [1, 1, 0, 0.5]], "tokens": 4, "stop_reason": "newline"},
        {"id": 2, "kind": "typed", "total_ms": 4.0, "stages_ms": {"context": 1.0, "prefill": 3.0}, "steps": [],
         "tokens": 0, "stop_reason": ""},
        {"id": 3, "kind": "prefetch", "total_ms": 10.0, "stages_ms": {"decode": 10.0}, "steps": [[2, 0, 0, 2.5]],
         "tokens": 2, "stop_reason": "max_tokens"},
        {"id": 9, "kind": "typed", "total_ms": 50.0, "stages_ms": {"decode": 50.0}, "steps": [], "tokens": 9,
         "stop_reason": "newline"},  # never answered to this client (cancelled): left out
    ]


CLIENT_MS = {1: 10.0, 2: 3.5, 3: 12.3456, 7: 1.0}  # 7: answered, but not in the server's recent list


def test_the_figures_of_three_matched_requests():
    b = breakdown(CLIENT_MS, recent())
    assert b["requests"] == 3 and [row["id"] for row in b["rows"]] == [1, 2, 3]
    assert b["kinds"] == {"typed": 2, "prefetch": 1}
    # transport: what the client measured beyond the server's total, never below zero (request 2's
    # server clock ran past the client's by half a millisecond)
    assert [row["stages_ms"]["transport"] for row in b["rows"]] == [2.0, 0.0, 2.346]
    # stages in the order they first appear, transport last; a stage a request lacks counts as 0
    assert list(b["stages"]) == ["context", "decode", "prefill", "transport"]
    assert b["stages"]["context"] == {"p50": 1.0, "p95": 2.0, "mean": 1.0}
    assert b["stages"]["decode"] == {"p50": 6.0, "p95": 10.0, "mean": 5.33}
    assert b["stages"]["prefill"] == {"p50": 0.0, "p95": 3.0, "mean": 1.0}
    assert b["stages"]["transport"] == {"p50": 2.0, "p95": 2.35, "mean": 1.45}
    assert b["client_ms"] == {"p50": 10.0, "p95": 12.35, "mean": 8.62}
    assert b["server_ms"] == {"p50": 8.0, "p95": 10.0, "mean": 7.33}
    assert b["server_share_of_client"] == round(22.0 / 25.846, 4)
    assert b["stop_reasons"] == {"newline": 1, "max_tokens": 1}  # request 2 stopped for no reason given
    # over the requests that generated tokens (1 and 3): 16 ms of decoding for 6 tokens
    assert b["tokens_per_request"] == {"p50": 4, "mean": 3.0} and b["decode_ms_per_token"] == 2.667
    assert b["decode_steps"] == {"count": 3, "drafted": 6, "accepted": 3, "ms_mean": 1.5}
    assert b["rows"][0] == {"id": 1, "client_ms": 10.0, "kind": "typed", "server_ms": 8.0,
                            "stages_ms": {"context": 2.0, "decode": 6.0, "transport": 2.0},
                            "steps": [[3, 2, 0, 1.5], [1, 1, 0, 0.5]], "tokens": 4, "stop_reason": "newline"}


def test_no_generated_token_and_no_step_give_none_not_a_division_by_zero():
    only = [{"id": "a", "kind": "typed", "total_ms": 2.0, "stages_ms": {"context": 2.0}, "steps": []}]
    b = breakdown({"a": 3.0}, only)
    assert b["requests"] == 1 and b["rows"][0]["tokens"] == 0 and b["rows"][0]["stop_reason"] == ""
    assert b["tokens_per_request"] is None and b["decode_ms_per_token"] is None
    assert b["decode_steps"] == {"count": 0, "drafted": 0, "accepted": 0, "ms_mean": None}
    assert b["stop_reasons"] == {} and b["server_share_of_client"] == round(2.0 / 3.0, 4)


def test_the_caller_s_timings_are_left_as_they_were_and_no_client_time_renders_a_dash():
    only = [{"id": "a", "kind": "typed", "total_ms": 2.0, "stages_ms": {"context": 2.0}, "steps": []}]
    b = breakdown({"a": 0.0}, only)
    assert only[0]["stages_ms"] == {"context": 2.0}  # transport is the breakdown's, not written back
    assert b["server_share_of_client"] is None
    assert "account for - of the client's latency" in render_breakdown(b)


def test_nothing_matched_is_an_empty_breakdown_and_says_so():
    b = breakdown({5: 1.0}, recent())
    assert b == {"requests": 0, "stages": {}, "rows": []}
    assert render_breakdown(b) == "breakdown: no answered request was matched to the server's timings"


def test_the_rendering_has_a_row_per_stage_then_the_totals_and_the_summary_lines():
    text = render_breakdown(breakdown(CLIENT_MS, recent()))
    lines = text.split("\n")
    assert lines[0] == "breakdown of 3 answered requests (typed 2, prefetch 1), ms:"
    firsts = [line.split("  ")[0].strip() for line in lines[1:]]
    stages = ["context", "decode", "prefill", "transport", "= server total", "client measured"]
    assert [f for f in firsts if f in stages] == stages  # in this order, each once
    decode = next(line for line in lines if line.startswith("decode "))
    assert decode.split()[1:] == ["6.000", "10.0", "5.330"]  # p50, p95, mean
    assert "the server's stages account for 85.1% of the client's latency" in text
    assert lines[-2] == ("tokens a request {'p50': 4, 'mean': 3.0}, decoding 2.667 ms a token; "
                         "stops newline 1, max_tokens 1")
    assert lines[-1] == "decoding steps 3: 6 draft nodes verified, 3 accepted, 1.5 ms a step"


def test_the_plot_is_a_png_with_a_panel_per_mode_with_answers(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is in the dev and plot extras")
    b = breakdown(CLIENT_MS, recent())
    path = tmp_path / "breakdown.png"
    plot_breakdowns([{"pause_ms": 0, "breakdown": b}, {"pause_ms": 300, "breakdown": breakdown({}, [])}], str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    # one panel (the mode without answers is left out): 12 x 3.5 inches at 110 dpi
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1320, 385)
    with pytest.raises(CommandError, match="needs --breakdown"):
        plot_breakdowns([{"pause_ms": 0, "breakdown": breakdown({}, [])}, {"pause_ms": 0}], str(path))


def test_the_plot_without_matplotlib_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it fails as if not installed
    with pytest.raises(CommandError, match=r"pip install 'memosight\[plot\]'"):
        plot_breakdowns([{"pause_ms": 0, "breakdown": breakdown(CLIENT_MS, recent())}], str(tmp_path / "x.png"))


def test_tokens_prefilled_per_keystroke_count_the_warm_ups_and_say_where_the_prompt_moved():
    def entry(i, kind, own, ahead, cause):
        return {"id": i, "kind": kind, "prefilled_tokens": own, "prefilled_ahead": ahead, "prefill_cause": cause}

    recent = [entry(1, "generated", 40, 0, "new"), entry(2, "generated", 2, 5, "typed"),
              entry(3, "generated", 0, 30, "context"), entry(4, "typed_through", 0, 0, ""),
              entry(5, "generated", 9, 0, "typed"), entry(6, "generated", 99, 0, "typed")]  # 6: not this client's
    out = prefill_per_keystroke({1: 10.0, 2: 20.0, 3: 30.0, 4: 1.0, 5: 5.0}, recent)
    assert out["requests"] == 4 and out["p50"] == 30 and out["p95"] == 40  # 7, 9, 30, 40
    assert {cause: (c["requests"], c["tokens"]) for cause, c in out["by_cause"].items()} == {
        "new": (1, 40), "typed": (2, 16), "context": (1, 30)}
    assert out["by_cause"]["typed"]["p50"] == 9 and out["by_cause"]["typed"]["p95"] == 9  # 7, 9: a typed key's own
    assert out["ahead_share"] == round(35 / 86, 4)
    assert prefill_per_keystroke({4: 1.0}, recent) is None  # no request ran the model
