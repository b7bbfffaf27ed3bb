import torch

from memosight.engine.threads import PrefillThreads, ThreadChooser


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
