"""similar.py: units like the code being written, found by the identifiers they share."""

from memosight.server.context.packing import ContextCompressor
from memosight.server.context.regions import analyze, without
from memosight.server.context.similar import MIN_SIMILARITY, query_names, similarities
from memosight.server.documents import Document

WORDS = lambda text: len(text.split())  # noqa: E731 - a stand-in for the model's tokenizer

TWIN = ("def load_rows(path):\n    \"\"\"Rows of a CSV file.\"\"\"\n    handle = open_csv(path, dialect)\n"
        "    reader = make_reader(handle, delimiter)\n    rows = [parse_row(line) for line in reader]\n    return rows\n")


def filler(n: int) -> str:
    return "".join(f"\n\ndef unrelated_{i}(a, b):\n    total = a * {i}\n    return total - b\n" for i in range(n))


def test_query_is_the_last_lines_without_common_names():
    above = "x = 1\n" + "".join(f"v{i} = w{i}\n" for i in range(10)) + "\n    if self.ready:\n"
    assert query_names(above) == {"v5", "w5", "v6", "w6", "v7", "w7", "v8", "w8", "v9", "w9", "ready"}


def test_body_units_score_their_jaccard_similarity_and_imports_and_signatures_none():
    text = "import csv\n\n\n" + TWIN + filler(3)
    doc = Document("file:///m.py", text, "python")
    analysis = analyze(*doc.snapshot(), "python")
    query = frozenset({"handle", "open_csv", "path", "dialect", "reader", "make_reader"})
    scores = similarities(analysis, query)
    by_kind = {analysis.units[u].kind for u, s in enumerate(scores) if s}
    assert by_kind == {"body"} and max(scores) > 0.3
    assert all(s == 0 or s >= MIN_SIMILARITY for s in scores)
    assert similarities(analysis, frozenset()) == [0.0] * len(analysis.units)


def test_the_packer_brings_a_far_twin_of_the_code_being_written():
    # no name of the new function is defined or assigned in the twin: only likeness brings it
    text = TWIN + filler(40) + "\n\ndef load_items(path):\n    fh = open_csv(path, dialect)\n    "
    doc = Document("file:///m.py", text, "python")
    packed = ContextCompressor().build(doc, len(text), 160, 0.0, WORDS)
    assert "rows = [parse_row(line) for line in reader]" in packed.prefix
    plain = ContextCompressor(weights=without(["similar_code"])).build(doc, len(text), 160, 0.0, WORDS)
    assert "parse_row" not in plain.prefix
