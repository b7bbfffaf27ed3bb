import pytest
import torch
from memosight.engine import EngineSettings, load_engine
from memosight.engine.decoding import kv


def test_prefix_tree_serves_an_earlier_prompt_after_switching(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    tree = engine.prompt_cache.prefix_tree
    tree.block_tokens = 16
    a = engine.encode("def first(a, b):\n    return a + b\n" * 6)
    b = engine.encode("class Second:\n    value = 1\n" * 6)
    out_a = engine.complete("def first(a, b):\n    return a + b\n" * 6, max_new_tokens=4)
    engine.complete("class Second:\n    value = 1\n" * 6, max_new_tokens=4)
    assert tree.stats()["blocks"] > 0
    before = engine.prompt_cache.reused_tokens
    again = engine.complete("def first(a, b):\n    return a + b\n" * 6, max_new_tokens=4)
    assert again.text == out_a.text
    assert engine.prompt_cache.reused_tokens - before >= 16  # whole blocks came from the tree
    assert len(a) > 16 and len(b) > 16


def test_cache_built_from_blocks_gives_the_same_tokens(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    tree = engine.prompt_cache.prefix_tree
    tree.block_tokens = 8
    ids = engine.encode("import os\nimport sys\n\ndef main(argv):\n    for arg in argv:\n        print(arg)\n")
    expected = engine.generate(ids, 10, speculative=False)
    engine.prompt_cache.remember()
    engine.prompt_cache.clear()  # forget the last prompt: only the tree can help now
    assert engine.generate(ids, 10, speculative=False) == expected
    assert tree.hit_tokens >= 8


def test_prefix_tree_evicts_least_recently_used_blocks_under_its_byte_cap():
    tree = kv.PrefixTree(block_tokens=4, max_bytes=0)

    class Layer:
        def __init__(self, n):
            self.keys = torch.zeros(1, 1, n, 2)
            self.values = torch.zeros(1, 1, n, 2)

    class Cache:
        def __init__(self, n):
            self.layers = [Layer(n)]

        def get_seq_length(self):
            return self.layers[0].keys.shape[-2]

    block_bytes = 4 * 2 * 4 * 2  # tokens * dims * float32 * (keys + values)
    tree.max_bytes = 2 * block_bytes
    tree.store(list(range(8)), Cache(8))  # blocks A, B
    assert len(tree.blocks) == 2 and tree.bytes == 2 * block_bytes
    tree.longest_prefix(list(range(4)))
    tree.store(list(range(100, 108)), Cache(8))  # two new blocks push the oldest out
    assert len(tree.blocks) == 2 and tree.bytes <= tree.max_bytes
    assert tree.longest_prefix(list(range(8))) == 0
    assert tree.longest_prefix(list(range(100, 108))) == 8


def test_one_typed_character_prefills_only_the_tail(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    text = "def total(items):\n    return sum(item.price for item in items)\n" * 30
    engine.complete(text, max_new_tokens=2)
    before_prompt, before_reused = engine.prompt_cache.prompt_tokens, engine.prompt_cache.reused_tokens
    engine.complete(text + "d", max_new_tokens=2)
    prompt = engine.prompt_cache.prompt_tokens - before_prompt
    reused = engine.prompt_cache.reused_tokens - before_reused
    assert prompt > 500 and prompt - reused <= 4


def test_block_aligned_prompt_served_from_the_tree_stays_exact(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    tree = engine.prompt_cache.prefix_tree
    tree.block_tokens = 8
    base = engine.encode("def f(a, b):\n    return a * b + a - b\n" * 4)
    a = (base * 3)[:32]  # a whole number of blocks
    b = list(reversed(a))
    expected = engine.generate(a, 6, speculative=False)
    engine.prompt_cache.remember()
    engine.generate(b, 6, speculative=False)
    engine.prompt_cache.remember()
    assert engine.generate(a, 6, speculative=False) == expected
    assert engine.prompt_cache.cache.get_seq_length() == len(engine.prompt_cache.tokens)


def test_zero_byte_cap_disables_the_tree(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    ids = engine.encode("import os\n" * 40)
    engine.generate(ids, 2)
    engine.prompt_cache.remember()
    engine.configure(EngineSettings(kv_cache_bytes=0))
    tree = engine.prompt_cache.prefix_tree
    assert tree.bytes == 0 and not tree.blocks and tree.longest_prefix(ids) == 0


def test_growable_layer_keeps_its_contents_when_it_grows_and_after_a_crop():
    layer = kv.GrowableLayer()
    first = torch.randn(1, 2, 200, 4)
    keys, _ = layer.update(first, first + 1)
    assert torch.equal(keys, first)
    second = torch.randn(1, 2, 300, 4)  # past the first buffer: it grows
    keys, values = layer.update(second, second + 1)
    assert layer.get_seq_length() == 500
    assert torch.equal(keys, torch.cat([first, second], dim=-2))
    assert torch.equal(values, torch.cat([first, second], dim=-2) + 1)
    layer.crop(-100)
    third = torch.randn(1, 2, 1, 4)
    keys, _ = layer.update(third, third)
    assert layer.get_seq_length() == 401
    assert torch.equal(keys, torch.cat([first, second[..., :200, :], third], dim=-2))
    with pytest.raises(ValueError):
        layer.crop(5)


def test_new_cache_uses_growable_layers_for_full_attention(tiny_model_dir):
    engine = load_engine(str(tiny_model_dir), device="cpu")
    cache = kv.new_cache(engine.model)
    assert all(isinstance(layer, kv.GrowableLayer) for layer in cache.layers)
    assert kv.supports_reuse(engine.model)


def test_the_prompt_cache_keeps_the_last_rendered_prompt_under_its_text_across_clear():
    cache = kv.PromptCache()
    key = ("def f(", ")\n", True, True)
    cache.remember_rendered(key, [1, 2, 3])
    assert cache.rendered(key) == [1, 2, 3]
    assert cache.rendered(("def g(", ")\n", True, True)) is None  # other text: rendered anew
    cache.clear()  # model state goes; how a text renders does not change with it
    assert cache.rendered(key) == [1, 2, 3]
