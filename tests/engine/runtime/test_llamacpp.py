"""The llama.cpp runtime on the exported embedded GGUF: a tree in one decode (each branch its own
sequence), the accepted path kept and the rest rolled back, the kernels' exact classes, and
speculative decoding equal to plain greedy decoding on this runtime."""

from __future__ import annotations

import numpy as np
import pytest
from memosight.engine.decoding.verify import DraftTree
from memosight.engine.runtime.llamacpp_prompt import RECOMPUTE

pytest.importorskip("llama_cpp", reason="llama-cpp-python is in the dev extras")

TEXT = '''def total(items):
    """The sum of the items' prices."""
    result = 0
    for item in items:
        result += item.price
    return result


def count(items):
    result = 0
    for item in items:
'''


@pytest.fixture(scope="module")
def runtime(embedded_gguf):
    from memosight.engine.runtime import llamacpp_kernels as kernels
    from memosight.engine.runtime.gguf_tokenizer import GgufTokenizer
    from memosight.engine.runtime.llamacpp import LlamaCppRuntime

    kernels.PADDING_PAYS = 100.0  # padding chosen whatever a busy machine's timings say (restored below)
    rt = LlamaCppRuntime(embedded_gguf, threads=1, n_ctx=1024)
    rt.tokenizer = GgufTokenizer(rt.L, rt.vocab)
    kernels.measure_kernel_classes(rt, rt.tokenizer.encode(TEXT * 6)[:320])  # past 256 cells, as at load
    yield rt
    rt.close()
    kernels.PADDING_PAYS = 1.25


def chain_logits(runtime, ids: list[int], tokens: list[int]) -> list[np.ndarray]:
    """Plain decoding's logits after each of `tokens`, from a fresh cache."""
    runtime.clear()
    _, logits = runtime.prefill_hidden(ids)
    out = [logits]
    for token in tokens:
        out.append(runtime.append(token)[1])
    return out


def test_the_kernel_classes_are_measured_and_decodes_keep_to_one(runtime):
    classes = runtime.kernel_classes
    assert [size for c in classes for size in c] == list(range(1, 17))  # every size, in order, in a class
    assert 1 <= runtime.min_rows <= runtime.exact_rows
    # padded where needed: plain steps and verification passes share a class, and it says so
    assert runtime.lossless and any(runtime.min_rows in c and runtime.exact_rows in c for c in classes)


def test_a_tree_in_one_decode_gives_each_node_the_logits_plain_decoding_gives_it(runtime):
    ids = runtime.tokenizer.encode(TEXT)
    truth = [int(logits.argmax()) for logits in chain_logits(runtime, ids, [])]
    root = truth[0]
    plain = chain_logits(runtime, ids, [root])  # after the prompt, and after the root
    after_root = int(plain[1].argmax())
    runtime.clear()
    runtime.prefill_hidden(ids)
    past = len(runtime.tokens)
    tree = DraftTree()
    tree.add(root, -1, "root")
    right = tree.add(after_root, 0, "test")  # the first chain: right
    tree.add((after_root + 1) % runtime.n_vocab, 0, "test")  # a second branch: wrong
    runtime.max_branches, saved = 16, runtime.max_branches
    try:
        verified = runtime.verify(tree)
    finally:
        runtime.max_branches = saved
    assert len(verified.branches) == 2  # two leaves, two sequences
    assert verified.greedy_next(0) == after_root
    assert np.allclose(verified.logits(0), plain[1], atol=1e-3)
    runtime.commit(verified, [0, right])
    assert runtime.tokens[past:] == [root, after_root] and len(runtime.tokens) == past + 2
    # the branches are gone: every sequence but 0 is empty, and 0 ends at the path
    L = runtime.L
    assert L.llama_memory_seq_pos_max(runtime.memory, 0) == past + 1
    assert all(L.llama_memory_seq_pos_max(runtime.memory, b) == -1 for b in (1, 2))


def test_a_rejected_chain_is_rolled_back(runtime):
    ids = runtime.tokenizer.encode(TEXT)
    plain = chain_logits(runtime, ids, [])
    root = int(plain[0].argmax())
    runtime.clear()
    runtime.prefill_hidden(ids)
    past = len(runtime.tokens)
    chain = DraftTree()
    node = chain.add(root, -1, "root")
    for token in (11, 12, 13):  # drafts greedy decoding will not agree with
        node = chain.add(token, node, "test")
    verified = runtime.verify(chain)
    assert not verified.branches  # a chain goes straight into sequence 0
    runtime.commit(verified, [0])
    assert runtime.tokens == ids + [root]
    assert runtime.L.llama_memory_seq_pos_max(runtime.memory, 0) == past


def test_speculative_decoding_on_llamacpp_equals_its_plain_greedy_decoding(embedded_gguf, tmp_path, monkeypatch):
    from memosight.engine import load_engine
    from memosight.engine.runtime import llamacpp_kernels

    monkeypatch.setenv("MEMOSIGHT_CACHE", str(tmp_path))  # measured here, not read from another run
    monkeypatch.setattr(llamacpp_kernels, "PADDING_PAYS", 100.0)  # lossless whatever a busy machine's timings say
    engine = load_engine(str(embedded_gguf), runtime="llamacpp")
    assert engine.status()["runtime"] == "llamacpp" and engine.model is None and engine.runtime.lossless
    source = TEXT * 3 + "def mean(items):\n    return total(items) / count("  # repeats: n-grams find drafts
    drafted = 0
    for cut in (120, 260, 400, len(source)):
        ids = engine.encode(source[:cut])
        plain = engine.generate(ids, 40, speculative=False)
        before = engine.speculator.stats.drafts.to_json().get("ngram", {}).get("drafted", 0)
        assert engine.generate(ids, 40, speculative=True) == plain
        drafted += engine.speculator.stats.drafts.to_json().get("ngram", {}).get("drafted", 0) - before
    assert drafted > 0  # the trees were there to verify


def test_a_build_whose_one_row_sums_apart_from_batches_decodes_plainly(embedded_gguf, tmp_path, monkeypatch):
    """lossless false (llamafile's kernels, padding too dear): no speculation, so no token may leave
    plain decoding's; status says why."""
    from memosight.engine import load_engine
    from memosight.engine.runtime import llamacpp_kernels

    monkeypatch.setenv("MEMOSIGHT_CACHE", str(tmp_path))
    real = llamacpp_kernels.measure_kernel_classes

    def split(rt, probe):  # what a llamafile build measures: one row a class of its own, padding dear
        real(rt, probe)
        rt.kernel_classes, rt.min_rows, rt.exact_rows, rt.lossless = [[1], [2, 4, 8]], 1, 8, False

    monkeypatch.setattr(llamacpp_kernels, "measure_kernel_classes", split)
    engine = load_engine(str(embedded_gguf), runtime="llamacpp")
    assert engine.runtime.lossless is False and not engine.can_speculate
    ids = engine.encode(TEXT * 2)
    assert engine.generate(ids, 20, speculative=True) == engine.generate(ids, 20, speculative=False)
    status = engine.status()["speculative"]
    assert status["enabled"] is False and "LLAMAFILE=OFF" in status["off_because"] and status["steps"] == 0


def test_the_engine_on_llamacpp_completes_with_fim_and_imports_neither_torch_nor_transformers(embedded_gguf):
    import subprocess
    import sys

    code = ("import sys; from memosight.engine import load_engine; "
            f"e = load_engine({str(embedded_gguf)!r}, runtime='llamacpp'); "
            "c = e.complete('def add(a, b):\\n    return ', '\\n', max_new_tokens=8); "
            "print(e.info().has_fim, 'transformers' in sys.modules, 'torch' in sys.modules, c.stop_reason != '')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "False", "False", "True"], out.stderr[-2000:]  # no torch either


def test_the_embedded_model_once_exported_loads_on_llamacpp_without_transformers(tmp_path):
    """The first load writes the embedded model as a GGUF file (through torch's loading); a later process
    finds the file and its runtime choice in the cache and imports no transformers."""
    import os
    import subprocess
    import sys

    code = ("import sys; from memosight.engine import load_engine; e = load_engine(runtime='llamacpp'); "
            "c = e.complete('def add(a, b):\\n    return ', max_new_tokens=4); "
            "print(e.status()['runtime'], 'transformers' in sys.modules)")
    env = {**os.environ, "MEMOSIGHT_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert first.stdout.split() == ["llamacpp", "True"], first.stderr[-2000:]  # exported now
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert again.stdout.split() == ["llamacpp", "False"], again.stderr[-2000:]


def test_the_kernel_classes_are_measured_once_per_cpu_and_file(embedded_gguf, tmp_path, monkeypatch):
    from memosight.engine import load_engine

    monkeypatch.setenv("MEMOSIGHT_CACHE", str(tmp_path))
    first = load_engine(str(embedded_gguf), runtime="llamacpp").status()["cache"]
    again = load_engine(str(embedded_gguf), runtime="llamacpp").status()["cache"]
    assert not first["kernel_classes_cached"] and again["kernel_classes_cached"]
    assert (again["min_rows"], again["exact_rows"], again["max_branches"]) == \
        (first["min_rows"], first["exact_rows"], first["max_branches"])
    assert (tmp_path / "llamacpp-kernels.json").is_file()
    # what a pass costs by its rows, for the tree sizer: measured with the classes, read back with them
    from memosight.engine.decoding.sizing import ROW_SIZES

    assert sorted(int(rows) for rows in first["pass_ms_at_load"]) == list(ROW_SIZES)
    assert all(ms > 0 for ms in first["pass_ms_at_load"].values())
    assert again["pass_ms_at_load"] == first["pass_ms_at_load"]


def test_a_pass_cost_measured_at_load_is_read_not_timed_again(runtime, monkeypatch):
    runtime.known_pass_ms = {1: 7.0, 2: 9.5}
    monkeypatch.setattr(runtime, "_timed_pass", lambda rows: pytest.fail(f"timed a pass of {rows} rows again"))
    assert (runtime.pass_ms(1), runtime.pass_ms(2)) == (7.0, 9.5)
    monkeypatch.undo()
    assert runtime.pass_ms(3) > 0  # a size not measured at load is timed
    runtime.known_pass_ms = {}


def test_a_padded_one_token_prefill_answers_with_its_own_row_not_the_padding(runtime):
    ids = runtime.tokenizer.encode(TEXT)
    saved, runtime.min_rows = runtime.min_rows, 2
    try:
        runtime.clear()
        runtime.prefill_hidden(ids[:-1])
        _, stepped = runtime.append(ids[-1])  # the last token alone, padded
        runtime.clear()
        runtime.prefill_hidden(ids[:-1])
        _, prefilled = runtime.prefill_hidden(ids)  # the same token as a prefill's one-token tail
    finally:
        runtime.min_rows = saved
    assert np.array_equal(prefilled, stepped)


def test_the_embedded_model_on_llamacpp_writes_what_it_writes_on_torch():
    """The exported file is prompted as the model was trained: its own tokenizer's split (llama.cpp's
    "gpt-2" regex cuts `__name__` in four) and its FIM order (memosight.json: suffix first). Before both,
    3 of these 4 completions were nonsense on llama.cpp."""
    from memosight.engine import load_engine

    from ..test_default_model import KNOWN_COMPLETIONS

    engine = load_engine(runtime="llamacpp")
    assert engine.fim_order == "spm"
    for prefix, suffix, expected in KNOWN_COMPLETIONS:
        assert engine.complete(prefix, suffix, max_new_tokens=16, single_line=True).text == expected, prefix


def test_with_hidden_states_a_prompts_last_state_is_the_one_every_output_gives(embedded_gguf):
    """Hidden states on: a prompt goes in without outputs and its last token alone with them, and
    `every_output` (what heads train on) gives every position's state in one decode."""
    from memosight.engine.runtime.gguf_tokenizer import GgufTokenizer
    from memosight.engine.runtime.llamacpp import LlamaCppRuntime

    rt = LlamaCppRuntime(embedded_gguf, threads=1, n_ctx=512, hidden=True)
    try:
        ids = GgufTokenizer(rt.L, rt.vocab).encode(TEXT)[:64]
        hidden, greedy = rt.every_output(ids)
        assert hidden.shape == (len(ids), rt.n_embd) and greedy.shape == (len(ids),) and rt.tokens == []
        last, logits = rt.prefill_hidden(ids)
        assert rt.tokens == ids and np.allclose(last, hidden[-1], atol=1e-3) and int(logits.argmax()) == greedy[-1]
        step_hidden, step_logits = rt.append(int(logits.argmax()))
        assert step_hidden.shape == (rt.n_embd,) and np.isfinite(step_logits).all()
    finally:
        rt.close()


def test_a_continuation_is_scored_with_plain_decodings_logits_and_leaves_only_the_prompt_cached(runtime):
    ids = runtime.tokenizer.encode(TEXT)
    prompt, target = ids[:-5], ids[-5:]
    expected = chain_logits(runtime, prompt, target[:-1])
    runtime.clear()
    got = runtime.continuation_logits(prompt, target)
    assert got.shape == (len(target), runtime.n_vocab)
    assert [int(row.argmax()) for row in got] == [int(row.argmax()) for row in expected]
    assert np.allclose(got, np.stack(expected), atol=1e-3)  # one chain decode: the class plain steps keep
    assert runtime.tokens == prompt  # the target's cells removed; the prompt's kept for the next one


def test_a_cancelled_prefill_stops_part_way_and_keeps_only_cells_it_computed(runtime):
    import threading

    from memosight.engine.runtime import Interrupted

    ids = (runtime.tokenizer.encode(TEXT * 40))[:runtime.n_ctx - 40]
    runtime.clear()
    _, expected = runtime.prefill_hidden(ids)
    runtime.clear()
    cancel = threading.Event()
    threading.Timer(0.005, cancel.set).start()
    with pytest.raises(Interrupted):
        runtime.prefill_hidden(ids, cancel)
    assert len(runtime.tokens) < len(ids) and runtime.tokens == ids[:len(runtime.tokens)]
    assert runtime.L.llama_memory_seq_pos_max(runtime.memory, 0) + 1 == len(runtime.tokens)  # no cell past them
    _, logits = runtime.prefill_hidden(ids)  # goes on from where it stopped
    assert int(logits.argmax()) == int(expected.argmax()) and np.allclose(logits, expected, atol=1e-3)


def test_a_stop_ends_a_long_prefill_after_its_chunk_and_its_last_chunk_at_once(runtime):
    """A key during a cold prompt's chunk lets the chunk end (the next key's prompt holds its
    tokens), so keys faster than a chunk still get the prompt on; the last chunk, which holds the
    typed tokens, stops part way."""
    import threading

    from memosight.engine.runtime import Interrupted
    from memosight.engine.runtime.llamacpp import CANCELLABLE_CHUNK

    ids = runtime.tokenizer.encode(TEXT * 40)[:3 * CANCELLABLE_CHUNK]
    key = threading.Event()
    decode, decoded = runtime._decode_padded, []

    def key_then_decode(items):
        key.set()  # the key comes as the decode starts: a watched one stops at its first node
        decoded.append(len(items))
        decode(items)

    runtime._decode_padded = key_then_decode
    try:
        runtime.clear()
        with pytest.raises(Interrupted):
            runtime.prefill_hidden(ids, key)
        assert runtime.tokens == ids[:CANCELLABLE_CHUNK] and seq0_holds_its_tokens(runtime)  # its first chunk ended
        key.clear()
        short = ids[:CANCELLABLE_CHUNK + 5]
        with pytest.raises(Interrupted):
            runtime.prefill_hidden(short, key)  # the last chunk: stopped, its cells dropped
        assert runtime.tokens == ids[:CANCELLABLE_CHUNK] and seq0_holds_its_tokens(runtime)
    finally:
        del runtime._decode_padded
    assert decoded == [CANCELLABLE_CHUNK, 5]


# --- a keystroke's moved cells (llamacpp_prompt.py) -------------------------------------------------

def fim_ids(runtime, prefix: str, suffix: str) -> list[int]:
    """A FIM-shaped prompt: the suffix behind the prefix, then one token the logits are read after."""
    encode = runtime.tokenizer.encode
    return encode(prefix) + [7] + encode(suffix) + [8]


def seq0_holds_its_tokens(runtime) -> bool:
    L, memory = runtime.L, runtime.memory
    return (L.llama_memory_seq_pos_min(memory, 0) == 0
            and L.llama_memory_seq_pos_max(memory, 0) + 1 == len(runtime.tokens))


SUFFIX = TEXT * 2


def test_a_key_before_the_suffix_computes_the_typed_tokens_and_the_runs_first_tokens_only(runtime):
    runtime.clear()
    runtime.recompute = 8
    old = fim_ids(runtime, TEXT + "def mean(items):\n    return ", SUFFIX)
    new = fim_ids(runtime, TEXT + "def mean(items):\n    return total(items)", SUFFIX)
    runtime.prefill_hidden(old)
    _, moved = runtime.prefill_hidden(new)
    typed = len(new) - len(old)
    assert runtime.tokens == new and seq0_holds_its_tokens(runtime)
    assert runtime.last_computed <= typed + 2 + 8 + 1  # the typed tokens (and the one healed), R, the last
    assert runtime.stale_from is not None and runtime.stale_from < len(new) - 1
    runtime.clear()
    _, fresh = runtime.prefill_hidden(new)
    assert np.corrcoef(moved, fresh)[0, 1] > 0.9 and not np.allclose(moved, fresh, atol=1e-3)  # near, not exact
    runtime.recompute = None  # every prompt exact: the same path computes all after the common prefix
    runtime.clear()
    runtime.prefill_hidden(old)
    _, exact = runtime.prefill_hidden(new)
    assert runtime.stale_from is None and np.allclose(exact, fresh, atol=1e-3)
    runtime.recompute = RECOMPUTE


def test_a_pause_makes_the_moved_cells_exact_and_a_key_stops_it_losing_at_most_a_chunk(runtime):
    import threading

    old = fim_ids(runtime, TEXT + "def mean(items):\n    ", SUFFIX)
    new = fim_ids(runtime, TEXT + "def mean(items):\n    n = count(items)\n    ", SUFFIX)
    runtime.clear()
    _, fresh = runtime.prefill_hidden(new)
    runtime.clear()
    runtime.prefill_hidden(old)
    runtime.prefill_hidden(new)
    runtime.append(5)  # what a suggestion generated: dropped by the refresh
    stale = runtime.stale_from
    stopped = threading.Event()
    stopped.set()
    assert runtime.refresh(stopped) == 0 and runtime.stale_from == stale  # a key came first: nothing done
    key = threading.Event()
    decode = runtime._decode_padded

    def one_chunk_then_a_key(items):
        decode(items)
        key.set()

    runtime._decode_padded = one_chunk_then_a_key
    try:
        done = runtime.refresh(key, chunk=16)  # a key during the first chunk: it is kept, no more
    finally:
        del runtime._decode_padded
    assert done == 16 and runtime.stale_from == stale + 16 and seq0_holds_its_tokens(runtime)
    done = runtime.refresh(threading.Event(), chunk=16)
    assert runtime.stale_from is None and runtime.tokens == new and seq0_holds_its_tokens(runtime)
    assert done == len(new) - stale - 16
    _, logits = runtime.prefill_hidden(new)  # the refresh's own logits, waiting for this very prompt
    assert np.allclose(logits, fresh, atol=1e-3)
    assert runtime.moves_json()["refreshed_tokens"] >= done


def test_a_stopped_keystroke_parks_its_moved_runs_for_the_next(runtime):
    import threading

    from memosight.engine.runtime import Interrupted

    runtime.clear()
    old = fim_ids(runtime, TEXT * 3 + "def mean(items):\n    return ", SUFFIX)
    runtime.prefill_hidden(old)
    new = fim_ids(runtime, TEXT * 3 + "def mean(items):\n    return total(items) / count(items)\n\n\ndef " * 3, SUFFIX)
    stopped = threading.Event()
    stopped.set()
    with pytest.raises(Interrupted):
        runtime.prefill_hidden(new, stopped)
    [parked] = runtime.parked
    assert seq0_holds_its_tokens(runtime) and len(parked.tokens) > 64  # the suffix, waiting
    moved_before = runtime.moved_tokens
    runtime.prefill_hidden(new)
    assert not runtime.parked and runtime.tokens == new and seq0_holds_its_tokens(runtime)
    assert runtime.moved_tokens - moved_before == len(parked.tokens) - runtime.recompute  # moved on from where it waited


def test_speculative_decoding_after_moved_cells_equals_plain_greedy_on_the_same_cache(embedded_gguf, tmp_path,
                                                                                     monkeypatch):
    from memosight.engine import load_engine
    from memosight.engine.runtime import llamacpp_kernels

    monkeypatch.setenv("MEMOSIGHT_CACHE", str(tmp_path))
    monkeypatch.setattr(llamacpp_kernels, "PADDING_PAYS", 100.0)
    engine = load_engine(str(embedded_gguf), runtime="llamacpp")
    rt = engine.runtime
    old = engine.prompt_ids(TEXT * 3 + "def mean(items):\n    return ", "\n\n" + TEXT)
    new = engine.prompt_ids(TEXT * 3 + "def mean(items):\n    return total(items) / ", "\n\n" + TEXT)
    runs = {}
    for speculative in (False, True):
        rt.clear()
        rt.prefill_hidden(old)
        runs[speculative] = list(engine._tokens(new, 40, engine.eos_ids, None, speculative))
        assert rt.moves_json()["moved_tokens"] > 0
    assert runs[True] == runs[False]
    assert engine.status()["moved_cells"]["on"] is True


def test_typing_on_without_a_pause_computes_it_all_once_the_drift_passes_its_bound(runtime, monkeypatch):
    from memosight.engine.runtime import llamacpp_prompt

    monkeypatch.setattr(llamacpp_prompt, "MAX_DRIFT", 12)
    runtime.clear()
    head = TEXT + "def mean(items):\n    "
    runtime.prefill_hidden(fim_ids(runtime, head, SUFFIX))
    typed, exact_keys = "", []
    for word in ["n = ", "count(", "items) ", "# the ", "number ", "of items ", "in the ", "list ", "given\n    "]:
        typed += word
        runtime.prefill_hidden(fim_ids(runtime, head + typed, SUFFIX))
        exact_keys.append(runtime.stale_from is None)
    assert any(exact_keys[1:]) and not all(exact_keys)  # moved most keys; one past the bound computed it all
    assert runtime.drift <= 12 + 16


def test_the_exact_prompt_setting_turns_moving_off_and_drops_what_was_moved(embedded_gguf, tmp_path, monkeypatch):
    from memosight.engine import load_engine
    from memosight.engine.protocol import EngineSettings

    monkeypatch.setenv("MEMOSIGHT_CACHE", str(tmp_path))
    engine = load_engine(str(embedded_gguf), runtime="llamacpp")
    rt = engine.runtime
    rt.prefill_hidden(engine.prompt_ids(TEXT + "def mean(items):\n    return ", "\n\n" + TEXT))
    rt.prefill_hidden(engine.prompt_ids(TEXT + "def mean(items):\n    return total", "\n\n" + TEXT))
    assert rt.stale_from is not None and engine.status()["moved_cells"]["on"] is True
    engine.configure(EngineSettings(exact_prompt=True))
    status = engine.status()["moved_cells"]
    assert rt.stale_from is None and status["on"] is False and status["why"] == "exact_prompt = true"
    rt.prefill_hidden(engine.prompt_ids(TEXT + "def mean(items):\n    return total(", "\n\n" + TEXT))
    assert rt.stale_from is None  # computed exactly
    engine.configure(EngineSettings())
    assert rt.recompute == RECOMPUTE


def test_a_key_in_the_second_half_of_the_typed_tokens_lets_them_end_and_moved_keys_rotate_once(runtime):
    """The next key's prompt holds this one's typed tokens (not the suffix's first, computed again):
    a key in the first half of their decode stops it, later it ends, and the keystroke stops before
    its last token, the suffix in place. llama.cpp shifts moved cells' keys at the start of the next
    decode, in place: one stopped there would be rotated again in full by the one after. So the
    cells are shifted only when placed (or parked by a stop), and that decode never stops."""
    import threading
    from os.path import commonprefix

    from memosight.engine.runtime import Interrupted

    old = fim_ids(runtime, TEXT + "def mean(items):\n    return ", SUFFIX)
    new = fim_ids(runtime, TEXT + "def mean(items):\n    return total(items)", SUFFIX)
    keep = len(commonprefix([old, new]))
    runtime.clear()
    runtime.prefill_hidden(old)
    _, straight = runtime.prefill_hidden(new)  # the same moves, no key
    typed = runtime.last_computed - 1  # the typed tokens and the suffix's first; then the last token
    key = threading.Event()
    decode, decoded = runtime._decode_padded, []
    key_at_rotation = None  # the key comes at the first decode with (True) or without (False) a shift pending
    half = 0.0  # the first half of the typed tokens' decode, in seconds (a key comes at its start)

    def key_then_decode(items):
        if runtime.shift_pending is key_at_rotation:
            key.set()  # before the decode starts: a watched one stops at its first node
        decoded.append(len(items))
        decode(items)

    runtime._decode_padded = key_then_decode
    runtime._half_pass_s = lambda rows: half
    try:
        runtime.clear()
        runtime.prefill_hidden(old)
        decoded.clear()
        key_at_rotation, half = False, 30.0
        with pytest.raises(Interrupted):
            runtime.prefill_hidden(new, key)  # a key in the first half: stopped at once
        assert decoded == [typed] and runtime.tokens == new[:keep] and seq0_holds_its_tokens(runtime)
        assert runtime.parked and runtime.shift_pending  # the suffix waits, shifted, for the next key
        key.clear(), decoded.clear()
        key_at_rotation = None
        _, resumed = runtime.prefill_hidden(new, key)
        key_at_rotation = False

        runtime.clear()
        runtime.prefill_hidden(old)
        key.clear(), decoded.clear()
        half = 0.0  # the key comes after the first half
        with pytest.raises(Interrupted):
            runtime.prefill_hidden(new, key)  # the typed tokens end; the stop comes before the last
        assert decoded == [typed] and runtime.tokens == new[:-1] and seq0_holds_its_tokens(runtime)
        assert runtime.shift_pending  # the suffix placed, its keys rotated by the next decode
        key.clear()
        _, resumed_after_half = runtime.prefill_hidden(new, key)

        runtime.clear()
        runtime.prefill_hidden(old)
        key.clear(), decoded.clear()
        key_at_rotation = True
        _, keyed = runtime.prefill_hidden(new, key)  # the suffix placed: the last token rotates it, whole
        assert decoded == [typed, 1] and key.is_set() and not runtime.shift_pending and runtime.tokens == new
    finally:
        del runtime._decode_padded, runtime._half_pass_s
    # rotated once, not twice (twice: 0.32 apart; batch splits: 0.004)
    for logits in (resumed, resumed_after_half, keyed):
        assert np.allclose(logits, straight, atol=3e-2)


def test_an_exact_continuation_moves_nothing_and_keeps_nothing_stale(runtime):
    runtime.clear()
    old = fim_ids(runtime, TEXT + "def mean(items):\n    return ", SUFFIX)
    new = fim_ids(runtime, TEXT + "def mean(items):\n    return total(", SUFFIX)
    runtime.prefill_hidden(old)
    runtime.prefill_hidden(fim_ids(runtime, TEXT + "def mean(items):\n    return t", SUFFIX))  # moved: stale
    moved = runtime.moved_tokens
    target = runtime.tokenizer.encode("items)")
    got = runtime.continuation_logits(new, target)
    assert runtime.moved_tokens == moved and runtime.stale_from is None
    runtime.clear()
    expected = runtime.continuation_logits(new, target)
    assert np.allclose(got, expected, atol=1e-3)


def test_a_prompt_over_the_context_names_the_setting_that_shortens_it(runtime):
    from memosight.engine.protocol import EngineError

    ids = runtime.tokenizer.encode(TEXT * 40)[:runtime.n_ctx]
    with pytest.raises(EngineError, match=r"lower `context_budget` to 992 or less"):
        runtime.prefill_hidden(ids)
    assert runtime.warm(ids, None) == 0  # a warm-up of it does nothing
