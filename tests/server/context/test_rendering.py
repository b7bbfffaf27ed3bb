"""Rendering chosen units as prompt text (rendering.py): file order, one elision marker per run of
skipped lines, `file:` headers relative to the file being edited, blank lines kept where they join
code, and the regions saying where each kept line came from."""

from types import SimpleNamespace

from memosight.server.context.far import Source
from memosight.server.context.packed import Region
from memosight.server.context.regions import Unit
from memosight.server.context.rendering import header, marker, render

STORE = ["import os\n", "\n", "\n", "class Store:\n", "    def put(self, key):\n", "        self.items.append(key)\n",
         "        return key\n", "    def get(self):\n", "        return self.items\n"]
# units by hand, not from analyze(): each test then says exactly which rows it chose
STORE_UNITS = [Unit("import", (0, 1)), Unit("signature", (3, 4)), Unit("signature", (4, 5)), Unit("body", (5, 7)),
               Unit("signature", (7, 8)), Unit("body", (8, 9))]
STORE_SCORES = [1.0, 0.5, 0.25, 0.125, 2.0, 1.23456]


def source(path: str = "pkg/store.py", lines=STORE, units=STORE_UNITS, scores=STORE_SCORES, rows=None,
           comment: str = "#") -> Source:
    # render reads only the analysis's lines and units
    analysis = SimpleNamespace(lines=list(lines), units=list(units))
    return Source(path, analysis, list(scores), rows or (0, len(lines)), comment)


def test_the_marker_is_indented_like_the_first_skipped_line_with_code():
    assert marker("\n    x = 1\n  y = 2\n", "#") == "    # ...\n"
    assert marker("\t\tfoo();\n", "//") == "\t\t// ...\n"
    assert marker("\n   \n", "#") == "" and marker("", "#") == ""  # nothing but blank lines: no marker


def test_the_header_names_a_file_relative_to_the_folder_of_the_one_being_edited():
    assert header(source("/w/pkg/util/helpers.py"), "/w/pkg/app/main.py") == "# file: ../util/helpers.py\n"
    assert header(source("/w/pkg/helpers.ts", comment="//"), "/w/pkg/main.ts") == "// file: helpers.ts\n"


def test_units_come_out_in_file_order_with_skipped_code_as_one_marker_and_a_region_per_kind():
    s = source()
    text, regions = render([s], [{5, 4, 1, 0}], with_headers=False, trailing=False, gap_before=False)
    # the blank lines between kept units stay; put()'s three lines become one marker at their indent
    assert text == "import os\n\n\nclass Store:\n    # ...\n    def get(self):\n        return self.items\n"
    assert regions == [Region("pkg/store.py", 1, 1, "import", 1.0), Region("pkg/store.py", 4, 4, "signature", 0.5),
                       Region("pkg/store.py", 8, 8, "signature", 2.0),
                       Region("pkg/store.py", 9, 9, "body", 1.235)]  # scores rounded to 3 places


def test_adjacent_rows_of_one_kind_are_one_region_with_the_first_units_score():
    text, regions = render([source()], [{1, 2}], False, False, False)
    assert text == "# ...\nclass Store:\n    def put(self, key):\n"
    assert regions == [Region("pkg/store.py", 4, 5, "signature", 0.5)]


def test_the_leading_gap_is_left_to_the_caller_with_gap_before_and_the_tail_marked_with_trailing():
    body = "        self.items.append(key)\n        return key\n"
    plain, regions = render([source()], [{3}], False, False, False)
    assert plain == "# ...\n" + body and regions == [Region("pkg/store.py", 6, 7, "body", 0.125)]
    after_marker, _ = render([source()], [{3}], False, False, True)
    assert after_marker == body  # the caller's text already ends with a marker for the lines above
    with_tail, _ = render([source()], [{3}], False, True, False)
    assert with_tail == "# ...\n" + body + "    # ...\n"  # get() below, marked at its indent


def test_rows_outside_the_sources_range_are_not_rendered():
    text, regions = render([source(rows=(0, 6))], [{3}], False, False, False)
    assert text == "# ...\n        self.items.append(key)\n"  # the body's second row is past the range
    assert regions == [Region("pkg/store.py", 6, 6, "body", 0.125)]


def test_other_files_come_under_headers_with_their_tail_marked_and_unchosen_ones_left_out():
    unused = source("/w/pkg/unused.py")
    other = source("/w/pkg/util/helpers.py")
    current = source("/w/pkg/app/main.py")
    text, regions = render([unused, other, current], [set(), {1}, set()], with_headers=True, trailing=False,
                           gap_before=False)
    # another file's skipped tail is always marked; the current file keeps its header with nothing chosen
    assert text == "# file: ../util/helpers.py\n# ...\nclass Store:\n    # ...\n# file: main.py\n"
    assert regions == [Region("/w/pkg/util/helpers.py", 4, 4, "signature", 0.5)]
    # without headers, a current file with nothing chosen adds nothing
    assert render([current], [set()], False, False, False) == ("", [])


def test_blank_lines_are_dropped_at_the_top_kept_after_the_callers_text_and_kept_at_the_end_with_trailing():
    lines = ["\n", "\n", "x = 1\n", "\n", "\n"]
    s = lambda rows: source("m.py", lines, [Unit("code", (2, 3))], [1.0], rows)  # noqa: E731
    assert render([s((0, 5))], [{0}], False, False, False)[0] == "x = 1\n"
    # rows from 1: the caller's text (the near part) ends just above; the blank line joins the two
    assert render([s((1, 5))], [{0}], False, False, False)[0] == "\nx = 1\n"
    assert render([s((0, 5))], [{0}], False, True, False)[0] == "x = 1\n\n\n"


def test_a_last_line_without_a_newline_gets_one():
    s = source("m.py", ["a = 1\n", "b = 2"], [Unit("code", (0, 2))], [0.5])
    assert render([s], [{0}], False, False, False) == ("a = 1\nb = 2\n", [Region("m.py", 1, 2, "code", 0.5)])
