import time

import pytest
from memosight.server.request.timeline import ORDER, StageStats, Timeline, Timelines


def test_marks_give_each_stage_the_time_since_the_last_and_add_up_to_the_whole():
    timeline = Timeline()
    time.sleep(0.01)
    timeline.mark("queue")
    time.sleep(0.02)
    timeline.split({"prefill": 5.0, "decode": 7.0}, rest="engine")
    timeline.mark("reply")
    timeline.end()
    stages = timeline.stages
    assert stages["queue"] >= 10 and stages["prefill"] == 5.0 and stages["decode"] == 7.0
    assert stages["engine"] >= 20 - 12
    assert sum(stages.values()) == pytest.approx(timeline.total_ms, rel=1e-6)
    assert list(timeline.to_json()["stages_ms"]) == [s for s in ORDER if s in stages]


def test_parts_that_claim_more_than_the_elapsed_time_leave_the_rest_at_zero():
    timeline = Timeline()
    timeline.split({"decode": 1000.0}, rest="engine")
    assert timeline.stages["engine"] == 0.0


def test_stage_stats_give_percentiles_per_request_and_keep_the_recent_timelines():
    stats = StageStats(keep=100)
    for i in range(10):
        timeline = Timeline(started=0.0)
        timeline.stages = {"queue": 1.0, "decode": float(i)}
        timeline.ended = 0.001 * (1 + i)
        stats.add(timeline, request_id=i)
    out = stats.to_json(recent=True)
    assert out["requests"] == 10
    assert out["stages_ms"]["queue"] == {"p50": 1.0, "p95": 1.0, "mean": 1.0}
    assert out["stages_ms"]["decode"]["p50"] == 5.0 and out["stages_ms"]["decode"]["p95"] == 9.0
    assert "prefill" not in out["stages_ms"]  # never spent: left out
    assert [r["id"] for r in out["recent"]] == list(range(10))
    assert "recent" not in stats.to_json()


def test_a_completions_timeline_runs_from_when_it_was_read_to_when_its_answer_was_written():
    recorded = []
    timelines = Timelines(lambda timeline, request_id: recorded.append((request_id, timeline)))
    read = time.perf_counter()
    timeline = timelines.start(7, read_at=read)
    timeline.mark("handler")
    writing = time.perf_counter()
    timelines.answered(8, None, writing)  # another request (no timeline): nothing recorded
    assert recorded == [] and len(timelines) == 1
    timelines.answered(7, -32800, writing)
    (request_id, done), = recorded
    assert request_id == 7 and done is timeline and done.kind == "cancelled" and len(timelines) == 0
    assert list(done.stages) == ["queue", "handler", "resume", "reply"]
    assert sum(done.stages.values()) == pytest.approx((time.perf_counter() - read) * 1000, abs=5)
    assert done.stages["resume"] == pytest.approx((writing - read) * 1000 - done.stages["queue"]
                                                  - done.stages["handler"], abs=0.01)
