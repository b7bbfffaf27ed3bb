import pytest
import torch
from memosight.engine.loading import threads as threads_module
from memosight.engine.loading.threads import PrefillThreads, ThreadChooser


@pytest.fixture(autouse=True)
def idle_machine(monkeypatch):
    """Tries of more threads happen only on cores that look free; these tests say they are."""
    monkeypatch.setattr(threads_module, "cores_free", lambda threads: True)


def test_the_faster_thread_count_is_used_and_the_other_probed_now_and_then():
    chooser = PrefillThreads((1, 2), min_tokens=8, probe_every=4)
    assert chooser.pick() == 1  # untried counts first
    chooser.record(1, 100, 0.2)
    assert chooser.pick() == 2
    chooser.record(2, 100, 0.1)  # two threads: half the time per token
    picks = []
    for _ in range(8):
        picks.append(chooser.pick())
        chooser.record(picks[-1], 100, 0.2 if picks[-1] == 1 else 0.1)
    assert picks.count(2) >= 6 and 1 in picks  # mostly the faster, the slower re-probed


def test_short_prefills_keep_the_decoding_threads_and_long_ones_restore_them():
    before = torch.get_num_threads()
    chooser = PrefillThreads((before, before + 1), min_tokens=64)
    with chooser.for_prefill(10):
        assert torch.get_num_threads() == before
    assert chooser.prefills == 0
    with chooser.for_prefill(500):
        assert torch.get_num_threads() == before  # the first untried choice
    with chooser.for_prefill(500):
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before and chooser.prefills == 2
    assert set(chooser.to_json()["ms_per_token"]) == {str(before), str(before + 1)}


def test_a_training_loop_keeps_the_chosen_count_between_steps_and_learns_the_fastest():
    before = torch.get_num_threads()
    chooser = ThreadChooser((before, before + 1), probe_every=40)
    assert chooser.best is None
    with chooser.measured(1, restore=False) as threads:
        assert threads == before
    with chooser.measured(1, restore=False) as threads:
        assert threads == before + 1
    assert torch.get_num_threads() == before + 1  # no switch back: the next step most likely runs with it too
    torch.set_num_threads(before)
    chooser.record(before, 1, 0.05)
    chooser.record(before + 1, 1, 2.0)  # much slower now: something else took the core
    assert chooser.best == before and chooser.runs == 4


def test_no_try_of_more_threads_while_the_cores_are_taken(monkeypatch):
    chooser = PrefillThreads((1, 2), min_tokens=8, probe_every=2)
    chooser.record(1, 100, 0.2)
    monkeypatch.setattr(threads_module, "cores_free", lambda threads: False)
    assert [chooser.pick() for _ in range(4)] == [1] * 4  # 2 untried, and not tried now
    monkeypatch.setattr(threads_module, "cores_free", lambda threads: True)
    assert chooser.pick() == 2


def test_a_long_prefill_tries_another_count_on_its_first_chunk_only():
    chooser = PrefillThreads((1, 2), min_tokens=32, probe_tokens=32)
    assert chooser.chunks(500) == [(0, 32, True), (32, 500, False)]
    assert chooser.chunks(40) == [(0, 40, True)]
    chooser.record(1, 100, 0.1)
    chooser.record(2, 100, 0.5)
    assert chooser.pick(probe=False) == 1


def test_fastest_runs_on_the_best_known_count_and_records_nothing():
    chooser = PrefillThreads((1, 2))
    before = torch.get_num_threads()
    with chooser.fastest():
        assert torch.get_num_threads() == 2  # nothing known yet: all the cores
    chooser.record(1, 100, 0.01)
    chooser.record(2, 100, 0.05)
    runs, known = chooser.runs, dict(chooser.ms_per_unit)
    with chooser.fastest():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before and chooser.runs == runs and chooser.ms_per_unit == known
