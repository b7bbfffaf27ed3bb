from memosight.server.context.far import FarPart, Source, choose
from memosight.server.languages import parser_for
from memosight.server.context.regions import analyze

CODE = '''import os


class Store:
    """Keeps things."""

    def put(self, key, value):
        self.items[key] = value

    def get(self, key):
        return self.items[key]


def helper(path):
    return os.path.join(path, "x")
'''


def count(text: str) -> int:
    return len(text.split())  # a tokenizer of words: the figures below are easy to follow


def source(scores_by_first_line: dict[str, float]) -> Source:
    analysis = analyze(CODE, parser_for("python").parse(CODE.encode()), "python")
    scores = [0.0] * len(analysis.units)
    for u, unit in enumerate(analysis.units):
        first = analysis.lines[unit.rows[0]].strip()
        scores[u] = scores_by_first_line.get(first, 0.0)
    return Source("pkg/store.py", analysis, scores, (0, len(analysis.lines)), "#")


def chosen_lines(part: FarPart) -> list[str]:
    return [line.strip() for line in part.text.splitlines() if line.strip()]


def test_the_best_scored_unit_comes_with_the_signatures_that_show_where_it_sits():
    s = source({"def get(self, key):": 5.0, "return self.items[key]": 5.0})
    part = choose([s], budget=200, marker_tokens=1, count=count, count_tokens=count,
                  with_headers=False, trailing=False, gap_before=False)
    lines = chosen_lines(part)
    assert "return self.items[key]" in lines and "class Store:" in lines  # its class, to say where it is
    assert "def helper(path):" not in lines  # scored 0: never chosen
    assert part.tokens == count(part.text) <= 200


def test_a_small_budget_takes_the_higher_score_and_units_come_out_in_file_order():
    s = source({"def helper(path):": 9.0, "return os.path.join(path, \"x\")": 9.0, "import os": 1.0,
                "def put(self, key, value):": 0.5, "self.items[key] = value": 0.5})
    wide = choose([s], 200, 1, count, count, False, False, False)
    assert chosen_lines(wide).index("import os") < chosen_lines(wide).index("def helper(path):")  # file order
    narrow = choose([s], count("def helper(path):\n    return os.path.join(path, \"x\")\n") + 2, 1, count, count,
                    False, False, False)
    assert "def helper(path):" in chosen_lines(narrow) and "def put(self, key, value):" not in chosen_lines(narrow)
    assert narrow.tokens <= count("def helper(path):\n    return os.path.join(path, \"x\")\n") + 2


def test_nothing_scored_or_no_budget_gives_an_empty_part():
    assert choose([source({})], 200, 1, count, count, False, False, False).text == ""
    assert choose([source({"import os": 3.0})], 0, 1, count, count, False, False, False).tokens == 0
