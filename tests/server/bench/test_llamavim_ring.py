import random

from memosight.server.bench.llamavim_ring import Ring

CFG = {"ring_n_chunks": 2, "ring_chunk_size": 64}


def test_a_picked_chunk_waits_in_the_queue_then_rotates_into_a_ring_of_fixed_size(tmp_path):
    path = tmp_path / "a.py"
    path.write_text("x")
    ring = Ring(CFG, random.Random(0))
    for i in range(3):
        ring.pick([f"def f{i}(a):", f"    return a * {i}", f"value_{i} = f{i}(2)"], str(path), False, True, True)
    ring.pick(["a", "b", "c"], str(path), True, True, True)  # a modified buffer: not picked
    assert len(ring.queued) == 3
    assert ring.rotate() and ring.rotate() and ring.rotate() and not ring.rotate()
    assert [c["data"][0] for c in ring.chunks] == ["def f1(a):", "def f2(a):"]  # the oldest went
    assert ring.extra()[0]["text"].startswith("def f1(a):\n")


def test_chunks_like_the_text_at_the_cursor_are_evicted(tmp_path):
    ring = Ring(CFG, random.Random(0))
    ring.chunks.append({"data": ["x = foo(bar)", "y = 1", "z = 2"], "str": "", "time": [0, 0], "filename": ""})
    ring.evict_like(["x = foo(bar)", "y = 1"], above=0.5)
    assert ring.chunks == [] and ring.n_evict == 1
