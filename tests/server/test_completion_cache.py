from memosight.server.completion_cache import LOOK_BACK, CompletionCache

URI = "file:///a.py"


def test_the_rest_of_a_completion_is_found_while_its_start_is_typed():
    cache = CompletionCache()
    cache.put(URI, "x = ", "\n", "compute(a, b)")
    assert cache.lookup(URI, "x = ", "\n").rest == "compute(a, b)"  # the same context
    assert cache.lookup(URI, "x = comp", "\n").rest == "ute(a, b)"
    assert cache.lookup(URI, "x = compute(a, b)", "\n") is None  # all of it typed: nothing left to show
    assert cache.lookup(URI, "x = compx", "\n") is None  # typed something else
    assert cache.lookup(URI, "x = comp", "\ny\n") is None  # the text after the cursor changed
    assert cache.lookup("file:///b.py", "x = comp", "\n") is None  # another document


def test_the_look_back_reaches_back_a_bounded_number_of_characters():
    cache = CompletionCache()
    long = "a" * (LOOK_BACK + 10)
    cache.put(URI, "s = '", "'\n", long)
    assert cache.lookup(URI, "s = '" + "a" * LOOK_BACK, "'\n").rest == "a" * 10
    assert cache.lookup(URI, "s = '" + "a" * (LOOK_BACK + 1), "'\n") is None


def test_the_nearest_context_wins_and_a_prefetch_is_counted():
    cache = CompletionCache()
    cache.put(URI, "x = ", "\n", "foo(1)")
    cache.put(URI, "x = fo", "\n", "obar()", source="prefetch")
    hit = cache.lookup(URI, "x = foo", "\n")
    assert hit.rest == "bar()" and hit.source == "prefetch" and cache.to_json()["prefetch_hits"] == 1


def test_entries_are_bounded_and_a_closed_document_forgotten():
    cache = CompletionCache(size=3)
    for n in range(5):
        cache.put(URI, f"x{n} = ", "", "value")
    assert cache.to_json()["entries"] == 3 and cache.lookup(URI, "x0 = ", "") is None
    cache.forget(URI)
    assert cache.to_json()["entries"] == 0 and not cache.has_document(URI)


def test_a_large_file_keys_on_the_text_near_the_cursor_and_its_length():
    cache = CompletionCache()
    big = "# filler\n" * 20_000
    cache.put(URI, big + "y = ", "", "1")
    assert cache.lookup(URI, big + "y = ", "").rest == "1"
    assert cache.lookup(URI, big[:-9] + "y = ", "") is None  # a line fewer: another context
