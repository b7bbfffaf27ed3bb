"""The soak run's pieces (soak.py): an edit goes to both servers and moves the client's copy, and the
project file is rewritten in turn through valid and broken versions, each announced to both."""

from memosight.server.bench.soak import CONFIG_VERSIONS, Doc, Pair, Soak, insert, rewrite_config


class Recorder:
    def __init__(self):
        self.sent = []

    def notify(self, method, params):
        self.sent.append((method, params))


def test_an_edit_reaches_both_servers_at_the_cursor_and_moves_the_clients_copy():
    test, reference = Recorder(), Recorder()
    doc = Doc("file:///a.py", "ab\ncd", cursor=4, remaining="xy")
    insert(Pair(test, reference), doc, "x")
    assert test.sent == reference.sent
    ((method, params),) = test.sent
    assert method == "textDocument/didChange" and params["textDocument"]["version"] == 2
    change = params["contentChanges"][0]
    assert change["range"]["start"] == {"line": 1, "character": 1} and change["text"] == "x"
    assert (doc.text, doc.cursor, doc.remaining) == ("ab\ncxd", 5, "y")


def test_the_project_file_goes_through_every_version_in_turn(tmp_path):
    test, reference = Recorder(), Recorder()
    stats = Soak()
    written = []
    for _ in range(len(CONFIG_VERSIONS) + 1):
        rewrite_config(Pair(test, reference), tmp_path, stats)
        written.append((tmp_path / ".memosight.toml").read_text())
    assert written == CONFIG_VERSIONS + CONFIG_VERSIONS[:1] and stats.config_rewrites == len(written)
    assert len(test.sent) == len(reference.sent) == len(written)
    assert {m for m, _ in test.sent} == {"workspace/didChangeWatchedFiles"}
