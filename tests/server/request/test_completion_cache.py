from memosight.server.request.completion_cache import LOOK_BACK, CompletionCache


def at(before: str, after: str) -> tuple[str, int]:
    """A context as the cache takes it: the document's text and the cursor in it."""
    return before + after, len(before)


URI = "file:///a.py"


def test_the_rest_of_a_completion_is_found_while_its_start_is_typed():
    cache = CompletionCache()
    cache.put(URI, *at("x = ", "\n"), "compute(a, b)")
    assert cache.lookup(URI, *at("x = ", "\n")).rest == "compute(a, b)"  # the same context
    assert cache.lookup(URI, *at("x = comp", "\n")).rest == "ute(a, b)"
    assert cache.lookup(URI, *at("x = compute(a, b)", "\n")) is None  # all of it typed: nothing left to show
    assert cache.lookup(URI, *at("x = compx", "\n")) is None  # typed something else
    assert cache.lookup(URI, *at("x = comp", "\ny\n")) is None  # the text after the cursor changed
    assert cache.lookup("file:///b.py", *at("x = comp", "\n")) is None  # another document


def test_the_look_back_reaches_back_a_bounded_number_of_characters():
    cache = CompletionCache()
    long = "a" * (LOOK_BACK + 10)
    cache.put(URI, *at("s = '", "'\n"), long)
    assert cache.lookup(URI, *at("s = '" + "a" * LOOK_BACK, "'\n")).rest == "a" * 10
    assert cache.lookup(URI, *at("s = '" + "a" * (LOOK_BACK + 1), "'\n")) is None


def test_the_nearest_context_wins_and_a_prefetch_is_counted():
    cache = CompletionCache()
    cache.put(URI, *at("x = ", "\n"), "foo(1)")
    cache.put(URI, *at("x = fo", "\n"), "obar()", source="prefetch")
    hit = cache.lookup(URI, *at("x = foo", "\n"))
    assert hit.rest == "bar()" and hit.source == "prefetch" and cache.to_json()["prefetch_hits"] == 1


def test_entries_are_bounded_and_a_closed_document_forgotten():
    cache = CompletionCache(size=3)
    for n in range(5):
        cache.put(URI, *at(f"x{n} = ", ""), "value")
    assert cache.to_json()["entries"] == 3 and cache.lookup(URI, *at("x0 = ", "")) is None
    cache.forget(URI)
    assert cache.to_json()["entries"] == 0 and not cache.has_document(URI)


def test_a_large_file_keys_on_the_text_near_the_cursor_and_its_length():
    cache = CompletionCache()
    big = "# filler\n" * 20_000
    cache.put(URI, *at(big + "y = ", ""), "1")
    assert cache.lookup(URI, *at(big + "y = ", "")).rest == "1"
    assert cache.lookup(URI, *at(big[:-9] + "y = ", "")) is None  # a line fewer: another context
