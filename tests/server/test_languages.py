import pytest
from memosight.server import languages

LANGUAGE_IDS = ["python", "javascript", "javascriptreact", "typescript", "typescriptreact", "go", "rust"]
SNIPPETS = {
    "python": "def f():\n    pass\n",
    "javascript": "function f() { return 1; }\n",
    "javascriptreact": "const App = () => <div>hi</div>;\n",
    "typescript": "function f(a: number): number { return a; }\n",
    "typescriptreact": "const App = (p: Props) => <div>{p.x}</div>;\n",
    "go": "package main\n\nfunc F() int { return 1 }\n",
    "rust": "fn f() -> u32 { 1 }\n",
}


@pytest.mark.parametrize("language_id", LANGUAGE_IDS)
def test_every_language_id_parses_and_has_a_query(language_id):
    tree = languages.parser_for(language_id).parse(SNIPPETS[language_id].encode())
    assert not tree.root_node.has_error
    assert languages.query_for(language_id) is not None
    kinds = {capture for match in languages.matches(language_id, tree.root_node) for capture in match}
    assert kinds & {"definition.function", "definition.variable"}


def test_unknown_languages_have_no_parser():
    assert languages.parser_for("plaintext") is None and languages.query_for("cobol") is None
    assert languages.matches("cobol", None) == []


def test_comment_syntax_for_elision_markers():
    assert languages.comment_prefix("python") == "#"
    assert languages.comment_prefix("typescriptreact") == "//" and languages.comment_prefix("rust") == "//"
    assert languages.comment_prefix("shellscript") == "#" and languages.comment_prefix("java") == "//"


def test_one_family_across_js_and_ts():
    assert len({languages.FAMILY[i] for i in ("javascript", "javascriptreact", "typescript", "typescriptreact")}) == 1


def test_parsers_are_per_thread():
    import threading

    mine = languages.parser_for("python")
    assert languages.parser_for("python") is mine
    other = []
    thread = threading.Thread(target=lambda: other.append(languages.parser_for("python")))
    thread.start()
    thread.join()
    assert other[0] is not mine
