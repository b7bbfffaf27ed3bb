"""What packing hands on (packed.py): a PackedContext and its regions, as `memosight context --json`
prints them."""

import json

from memosight.server.context.packed import PackedContext, Region


def test_to_json_is_the_printed_shape_and_survives_a_json_round_trip():
    context = PackedContext("def f(x):\n    return ", "\n\nx = 1\n", 12, [
        Region("pkg/m.py", 1, 2, "cursor_prefix", 1.0),
        Region("pkg/util.py", 10, 14, "function", 0.375)])
    expected = {
        "prefix": "def f(x):\n    return ", "suffix": "\n\nx = 1\n", "prompt_tokens": 12,
        "regions": [
            {"path": "pkg/m.py", "start_line": 1, "end_line": 2, "kind": "cursor_prefix", "score": 1.0},
            {"path": "pkg/util.py", "start_line": 10, "end_line": 14, "kind": "function", "score": 0.375}],
    }
    assert context.to_json() == expected
    # what the command prints is plain JSON: nothing in it that json cannot write and read back
    assert json.loads(json.dumps(context.to_json())) == expected


def test_regions_keep_their_order_and_an_empty_context_has_none():
    regions = [Region("a.py", i, i, kind, i / 10) for i, kind in enumerate(["imports", "function", "imports"], 1)]
    out = PackedContext("p", "s", 2, regions).to_json()["regions"]
    assert [(r["start_line"], r["kind"]) for r in out] == [(1, "imports"), (2, "function"), (3, "imports")]
    assert PackedContext("", "", 0).to_json() == {"prefix": "", "suffix": "", "prompt_tokens": 0, "regions": []}


def test_each_context_gets_its_own_region_list():
    # a shared default list would leak one context's regions into every other built without any
    first, second = PackedContext("a", "", 1), PackedContext("b", "", 1)
    first.regions.append(Region("a.py", 1, 1, "code", 0.5))
    assert second.regions == [] and second.to_json()["regions"] == []


def test_the_json_is_a_copy_the_caller_may_change():
    context = PackedContext("p", "s", 1, [Region("a.py", 1, 2, "function", 0.5)])
    context.to_json()["regions"][0]["kind"] = "changed"
    assert context.regions[0].kind == "function"
