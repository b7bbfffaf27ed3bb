"""The workspace index: names defined per file, which files define the names near the cursor."""

from pathlib import Path

from memosight.server.context.workspace import WorkspaceIndex, defined_names
from memosight.server.documents import Document


def test_defined_names_per_language():
    python = "import os\nMAX_SIZE = 3\nlimit: int = 4\nclass Box:\n    def open(self):\n        x = 1\nasync def fetch():\n    pass\nif a == b:\n    pass\n"
    assert defined_names(python, "python") == {"MAX_SIZE", "limit", "Box", "open", "fetch"}
    js = "export default function render() {}\nexport const API_URL = 'x';\nclass Store {}\ninterface Props {}\nlet count = 0;\n"
    assert defined_names(js, "ecmascript") == {"render", "API_URL", "Store", "Props", "count"}
    go = "package m\nfunc Parse(s string) int {}\nfunc (r *Reader) Next() {}\ntype Reader struct {}\nconst Limit = 3\n"
    assert defined_names(go, "go") == {"Parse", "Next", "Reader", "Limit"}
    grouped = "const (\n\tRed Color = iota\n\tGreen\n)\n\nvar (\n\tcache = map[string]int{}\n)\n"
    assert defined_names(grouped, "go") == {"Red", "Green", "cache"}
    rust = "pub fn parse() {}\npub(crate) struct Reader {}\nenum Kind {}\nconst LIMIT: u32 = 3;\nimpl Reader {\n    fn next(&self) {}\n}\n"
    assert defined_names(rust, "rust") == {"parse", "Reader", "Kind", "LIMIT", "next"}
    assert defined_names("int main() {}", "c") == frozenset()
    # modifiers are not names, and locals are not definitions
    assert defined_names("export default class extends Base {}\nfunction f() {\n  const local = 1;\n}\n"
                         "export abstract class Shape {}\nfunction* gen() {}\n", "ecmascript") == {"f", "Shape", "gen"}
    assert defined_names("pub const fn new() {}\nstatic mut COUNT: u32 = 0;\nconst unsafe fn raw() {}\n"
                         "pub extern \"C\" fn callback() {}\n", "rust") == {"new", "COUNT", "raw", "callback"}


def make_workspace(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "geometry.py").write_text("def area(w, h):\n    return w * h\n\nclass Shape:\n    pass\n")
    (root / "pkg" / "units.py").write_text("METRES_PER_FOOT = 0.3048\n\ndef area(shape):\n    return 0\n")
    (root / "pkg" / "web.ts").write_text("export function area(w: number) { return w; }\n")
    (root / "node_modules" / "dep").mkdir(parents=True)
    (root / "node_modules" / "dep" / "index.py").write_text("def METRES_PER_FOOT():\n    pass\n")
    (root / "pkg" / "huge.py").write_text("def giant():\n    pass\n" + "#" * 400_000)
    return root


def test_scan_indexes_source_files_and_skips_vendored_folders_and_huge_files(tmp_path):
    index = WorkspaceIndex(make_workspace(tmp_path))
    index.start().join(timeout=10)
    assert index.ready.is_set() and len(index) == 3  # geometry.py, units.py, web.ts
    assert index.definers({"METRES_PER_FOOT"}, "python") == [str(tmp_path / "pkg" / "units.py")]
    assert index.definers({"giant"}, "python") == []


def test_definers_prefer_files_defining_rarer_names_and_leave_out_excluded_ones(tmp_path):
    index = WorkspaceIndex(make_workspace(tmp_path))
    index.scan()
    geometry, units = str(tmp_path / "pkg" / "geometry.py"), str(tmp_path / "pkg" / "units.py")
    # `area` is in both Python files (half a point each), `Shape` only in geometry.py.
    assert index.definers({"area", "Shape"}, "python") == [geometry, units]
    assert index.definers({"area", "Shape"}, "python", exclude={geometry}) == [units]
    assert index.definers({"area"}, "ecmascript") == [str(tmp_path / "pkg" / "web.ts")]
    docs = index.documents_at([geometry])
    assert docs[0].language == "python" and "def area" in docs[0].text and docs[0].path == geometry


def test_update_and_remove_follow_the_files(tmp_path):
    index = WorkspaceIndex(make_workspace(tmp_path))
    index.scan()
    units = tmp_path / "pkg" / "units.py"
    units.write_text("def convert(x):\n    return x\n")
    index.update(units)
    assert index.definers({"METRES_PER_FOOT"}, "python") == []
    assert index.definers({"convert"}, "python") == [str(units)]
    units.unlink()
    index.update(units)
    assert index.definers({"convert"}, "python") == [] and len(index) == 2


def test_scan_stops_at_the_file_cap_and_the_time_cap(tmp_path):
    for i in range(5):
        (tmp_path / f"m{i}.py").write_text(f"def f{i}():\n    pass\n")
    index = WorkspaceIndex(tmp_path, max_files=3)
    index.scan()
    assert len(index) == 3 and index.ready.is_set()
    out_of_time = WorkspaceIndex(tmp_path, max_seconds=-1.0)
    out_of_time.scan()
    assert len(out_of_time) == 0 and out_of_time.ready.is_set()


def test_a_symlinked_workspace_has_one_key_per_file(tmp_path):
    real = make_workspace(tmp_path / "real")
    (tmp_path / "link").symlink_to(real)
    index = WorkspaceIndex(tmp_path / "link")
    index.scan()
    units_via_link = tmp_path / "link" / "pkg" / "units.py"
    index.update(units_via_link)  # a save reported through the other spelling
    assert len(index) == 3
    assert index.definers({"METRES_PER_FOOT"}, "python", exclude={str(units_via_link)}) == []
    assert index.covers(units_via_link) and not index.covers(tmp_path / "link" / "node_modules" / "dep" / "index.py")
    assert not index.covers(tmp_path / "elsewhere.py") and not index.covers(tmp_path / "link" / "pkg" / "notes.txt")


def test_links_that_lead_out_of_the_workspace_are_not_indexed(tmp_path):
    root = make_workspace(tmp_path / "root")
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "secret.py").write_text("SECRET_TOKEN = 'hunter2'\n")
    (outside / "deep" / "more.py").write_text("OTHER_SECRET = 1\n")
    (root / "leak.py").symlink_to(outside / "secret.py")
    (root / "leaks").symlink_to(outside / "deep", target_is_directory=True)
    index = WorkspaceIndex(root)
    index.scan()
    assert len(index) == 3  # the workspace's own files only
    assert not index.update(root / "leak.py") and not index.update(root / "leaks" / "more.py")
    assert index.definers({"SECRET_TOKEN"}, "python", exclude=set()) == []
    assert index.definers({"OTHER_SECRET"}, "python", exclude=set()) == []
    # a file indexed, then replaced by a link out: its text is not read again
    inside = root / "pkg" / "units.py"
    key = index.definers({"METRES_PER_FOOT"}, "python", exclude=set())
    inside.unlink()
    inside.symlink_to(outside / "secret.py")
    assert index.documents_at(key) == []


def test_an_indexed_file_replaced_by_a_pipe_or_grown_huge_is_not_read(tmp_path):
    import os

    root = make_workspace(tmp_path / "root")
    index = WorkspaceIndex(root, max_bytes=10_000)
    index.scan()
    units, geometry = root / "pkg" / "units.py", root / "pkg" / "geometry.py"
    keys = index.definers({"METRES_PER_FOOT", "Shape"}, "python", exclude=set())
    units.unlink()
    os.mkfifo(units)  # reading it would wait for a writer forever
    geometry.write_text("x = 1\n" * 5000)
    assert index.documents_at(keys) == []


def test_a_builtin_name_never_brings_in_another_file(tmp_path):
    (tmp_path / "compat.py").write_text("str = str\nbytes = bytes\n\n\ndef helper_of_note(x):\n    return x\n")
    index = WorkspaceIndex(tmp_path)
    index.scan()
    doc = Document((tmp_path / "main.py").as_uri(), "def f(v):\n    return str(v) + bytes(v)\n", "python")
    assert index.documents_for(doc, len(doc.text), []) == []  # str and bytes are everyone's
    doc = Document((tmp_path / "main.py").as_uri(), "def f(v):\n    return helper_of_note(str(v))\n", "python")
    assert [d.path for d in index.documents_for(doc, len(doc.text), [])] == [str(tmp_path / "compat.py")]


def test_a_name_imported_near_the_cursor_brings_the_file_defining_it(tmp_path):
    (tmp_path / "files.py").write_text("def open(path, mode='rb'):\n    return path\n\n\ndef size_of(path):\n    return 0\n")
    index = WorkspaceIndex(tmp_path)
    index.scan()
    for n, (imports, use) in enumerate((("from .files import size_of", "size_of(v)"),
                                        ("from .files import open", "open(v)"))):  # the file's own `open`
        doc = Document((tmp_path / f"main{n}.py").as_uri(), f"{imports}\n\n\ndef f(v):\n    return {use}\n", "python")
        assert [d.path for d in index.documents_for(doc, len(doc.text), [])] == [str(tmp_path / "files.py")]
