"""The bounded caches shared by documents, the compressor and the workspace index."""

from memosight.server.caching import LRU, content_hash


def test_lru_evicts_the_least_recently_used_entry():
    cache = LRU(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recently used
    cache.put("c", 3)
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3 and len(cache) == 2


def test_content_hash_tells_texts_apart_and_takes_lone_surrogates():
    assert content_hash("def f():\n") == content_hash("def f():\n") != content_hash("def g():\n")
    assert content_hash("\ud800") == content_hash("\ud800") != content_hash("\udc00")
