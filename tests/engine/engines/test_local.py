"""The in-process engine: greedy decoding equal to transformers', streaming, cancel, FIM prompts,
and the Engine protocol (configure, cold requests, status, close)."""

import threading

import pytest
import torch
from memosight.engine import CompletionRequest, EngineSettings, RequestOptions, StopRule, load_engine


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_generate_equals_transformers_greedy(tiny_models, arch):
    engine = load_engine(str(tiny_models[arch]), device="cpu")
    prompts = ["def add(a, b):\n    return", "class Item:\n    name", "import os\n", "x = [1, 2, 3]\nprint(x"]
    for prompt in prompts:
        ids = engine.encode(prompt)
        expected = engine.model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0, len(ids):]
        for speculative in (True, False):
            assert engine.generate(ids, 24, speculative=speculative) == expected.tolist()


def test_generate_reuses_the_cached_prefix_and_stays_exact(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    base = engine.encode("def total_value(self) -> float:\n    return sum(")
    first = engine.generate(base, 8)
    longer = base + engine.encode("item")
    second = engine.generate(longer, 8)
    fresh = load_engine(str(tiny_model_dir), device="cpu").generate(longer, 8)
    assert second == fresh
    assert engine.prompt_cache.reused_tokens >= len(base) - 1
    assert first  # something came out


def test_fim_template_detected_and_rendered(tiny_models):
    engine = load_engine(str(tiny_models["llama"]), device="cpu")
    assert engine.fim.name == "starcoder"
    ids = engine.prompt_ids("a = 1\n", "\nb = 2")
    assert ids[0] == engine.vocab["<fim_prefix>"] and ids[-1] == engine.vocab["<fim_middle>"]
    assert engine.vocab["<fim_suffix>"] in ids
    plain = load_engine(str(tiny_models["gpt2"]), device="cpu")
    assert plain.fim.name == "plain"
    assert plain.prompt_ids("a = 1\n", "b") == plain.encode("a = 1\n")


def test_special_token_text_in_a_file_stays_text(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    ids = engine.prompt_ids("s = '<fim_middle>'", "")
    assert ids.count(engine.vocab["<fim_middle>"]) == 1


def test_stream_pieces_join_to_the_completion(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    request = CompletionRequest("def add(a, b):\n    return ", "", "python", 20, StopRule())
    stream = engine.stream(request)
    pieces = list(stream)
    assert "".join(pieces) == stream.completion.text
    assert stream.completion.tokens <= 20


def test_cancel_stops_between_steps(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    cancel = threading.Event()
    request = CompletionRequest("x = ", "", "python", 200, StopRule(), cancel)
    stream = engine.stream(request)
    for _ in stream:
        cancel.set()
    assert stream.completion.stop_reason == "cancelled"
    assert stream.completion.tokens < 200


def test_spm_order_from_the_model_folder_puts_the_prefix_last(tiny_model_dir, tmp_path):
    import shutil

    folder = tmp_path / "spm"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "memosight.json").write_text('{"fim_order": "spm"}')
    engine = load_engine(str(folder), device="cpu")
    ids = engine.prompt_ids("a = 1\n", "\nb = 2")
    v = engine.vocab
    assert ids[:2] == [v["<fim_prefix>"], v["<fim_suffix>"]]
    assert ids[-len(engine.encode("a = 1\n")):] == engine.encode("a = 1\n")
    # typing extends the prompt at its end only
    longer = engine.prompt_ids("a = 1\nc", "\nb = 2")
    assert longer[: len(ids) - 1] == ids[:-1]


def test_continuation_loss_is_low_for_what_the_model_would_write(repeater_model_dir):
    engine = load_engine(str(repeater_model_dir), device="cpu")
    likely, n_likely = engine.continuation_loss("a = 1\n", "", "xxxx")
    unlikely, n_unlikely = engine.continuation_loss("a = 1\n", "", "b = 2")
    assert n_likely == len(engine.encode("xxxx")) and n_unlikely == len(engine.encode("b = 2"))
    assert 0.0 <= likely / n_likely < unlikely / n_unlikely
    assert engine.continuation_loss("a = 1\n", "", "") == (0.0, 0)


def test_the_local_engine_serves_the_protocol_end_to_end(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    assert engine.count_tokens("def f(x):\n    return x\n") == len(engine.encode("def f(x):\n    return x\n")) > 0
    request = CompletionRequest("def f(x):\n    return", "", max_new_tokens=5)
    engine.prefill(request)  # the prompt computed ahead: the request then reuses it
    completion = engine.stream(request).result()
    assert completion.tokens <= 5 and completion.prompt_tokens > 0
    assert completion.reused_tokens >= completion.prompt_tokens - 2  # all but the last tokens came from the prefill
    info = engine.status()
    assert info["device"] == "cpu" and info["requests"] >= 1
    assert {"model", "dtype", "speculative", "cache", "latency_ms"} <= info.keys()
    # the torch runtime computes every token after the common prefix, and says so
    assert info["moved_cells"]["on"] is False and "llama.cpp" in info["moved_cells"]["why"]
    assert engine.refresh(threading.Event()) == 0


def test_configure_switches_speculation_and_bounds_the_prefix_tree(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    request = lambda: CompletionRequest("def add(a, b):\n    return a + b\n" * 20, "", "python", 12)  # noqa: E731
    engine.stream(request()).result()
    assert engine.status()["speculative"]["steps"] > 0
    steps = engine.status()["speculative"]["steps"]
    engine.configure(EngineSettings(speculative=False, kv_cache_bytes=0))
    plain = engine.stream(request()).result()
    assert engine.status()["speculative"]["steps"] == steps  # the plain loop ran
    assert engine.status()["speculative"]["enabled"] is False
    assert engine.status()["cache"]["prefix_tree"]["bytes"] == 0
    engine.configure(EngineSettings(speculative=True))
    assert engine.stream(request()).result().text == plain.text


def test_a_cold_request_reuses_nothing(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    prefix = "def add(a, b):\n    return a + b\n" * 20
    engine.stream(CompletionRequest(prefix, max_new_tokens=4)).result()
    warm = engine.stream(CompletionRequest(prefix, max_new_tokens=4)).result()
    cold = engine.stream(CompletionRequest(prefix, max_new_tokens=4, options=RequestOptions(cold=True))).result()
    assert warm.reused_tokens > 0 and cold.reused_tokens == 0
    assert cold.text == warm.text


def test_closing_a_stream_early_frees_the_engine(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    stream = engine.stream(CompletionRequest("x = ", max_new_tokens=200, stop=StopRule()))
    next(stream, None)
    stream.close()
    assert engine.stream(CompletionRequest("y = ", max_new_tokens=2)).result().tokens <= 2  # not deadlocked


def test_a_finished_stream_keeps_its_completion_when_read_or_closed_again(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    stream = engine.stream(CompletionRequest("def f(x):\n    return ", max_new_tokens=4))
    text = "".join(stream)
    stream.close()
    assert stream.result().text == text and list(stream) == []


def test_a_prefilled_prompt_is_found_warm_and_a_cancelled_prefill_keeps_what_it_did(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    prefix = "def add(a, b):\n    return a + b\n" * 40
    engine.prefill(CompletionRequest(prefix, max_new_tokens=4))
    warm = engine.stream(CompletionRequest(prefix, max_new_tokens=4)).result()
    assert warm.prompt_tokens == warm.reused_tokens  # nothing ran on the request's path before decoding
    assert warm.stages_ms["prefill"] == 0.0
    assert engine.status()["cache"]["prefilled_ahead"] == warm.prompt_tokens
    stopped = threading.Event()
    stopped.set()
    engine.prefill(CompletionRequest(prefix + "x = 1\n" * 50, max_new_tokens=4, cancel=stopped))
    assert engine.status()["cache"]["prefilled_ahead"] == warm.prompt_tokens  # cancelled: nothing more
    cold = engine.stream(CompletionRequest(prefix, max_new_tokens=4)).result()
    assert cold.text == warm.text
    engine.configure(EngineSettings(speculative=False))  # the logits it found ready are the logits it computes
    engine.prompt_cache.clear()
    assert engine.stream(CompletionRequest(prefix, max_new_tokens=4)).result().text == warm.text


def test_a_single_line_ends_before_the_first_token_the_model_is_unsure_of(tiny_model_dir):
    from memosight.engine.decoding.speculate import greedy_tokens

    engine = load_engine(str(tiny_model_dir), device="cpu")
    prefix = "def total(items):\n    result = 0\n    for item in items:\n        result"
    ids = engine.prompt(prefix, heal=False).ids
    confidences: list[float] = []
    engine.prompt_cache.clear()
    tokens = list(engine.runtime.steps(greedy_tokens(engine.runtime, ids, 12, engine.end_ids, confidences=confidences)))
    assert len(confidences) == len(tokens)
    ends = [i for i, t in enumerate(tokens) if t in engine.end_ids] + [len(tokens)]
    k = min(range(1, ends[0]), key=lambda i: confidences[i])  # the least sure token after the first
    assert confidences[k] < min(confidences[:k])  # (holds for this model and prompt)
    threshold = (confidences[k] + min(confidences[:k])) / 2
    for speculative in (False, True):
        engine.configure(EngineSettings(speculative=speculative))
        run = lambda t: engine.stream(CompletionRequest(  # noqa: E731
            prefix, "", max_new_tokens=12, stop=StopRule(min_confidence=t), options=RequestOptions(heal=False))).result()
        assert run(0.0).stop_reason != "unsure"
        cut = run(threshold)  # ends just before token k, with what came before it
        assert cut.stop_reason == "unsure" and cut.text == engine.decode(tokens[:k]).rstrip("\ufffd")
        nothing = run(0.999)  # a random tiny model is sure of nothing: no suggestion at all
        assert nothing.text == "" and nothing.stop_reason == "unsure"
