"""Workspace files the editor has not opened: which of them define the names used near the cursor.

A background scan lists the workspace's source files and the names each one defines, read with a
per-language pattern over definition lines (cheap enough for thousands of files; tree-sitter parses
only the few files a request picks). A request asks for the files that define the most of the
names near the cursor, rarer names counting more; the compressor then treats them like other open
documents: definitions of used names ranked, signatures first.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from pathlib import Path
from stat import S_ISREG

from ..caching import LRU
from ..documents import Document
from .. import languages
from .regions import analyze, identifiers

log = logging.getLogger(__name__)

MAX_FILES = 5000  # a bigger workspace is indexed up to this many files (the first found, walking down)
MAX_FILE_BYTES = 300_000  # generated tables and vendored bundles are skipped
MAX_SCAN_SECONDS = 30.0  # a workspace root at a home folder could otherwise be walked for minutes
MAX_DEFINERS = 8  # a name defined in more files than this (run, __init__, new) says nothing about which
# Names used this close before the cursor (and a quarter of it after) send for the workspace files
# that define them: about the 60 lines a reader would look at.
NEAR_CHARS = 3000
IDENTIFIER_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
# What a document defines is read from an analysis at most this many edits old (a long file's parse
# and analysis cost 10-30 ms, and its definitions hardly change while the user types); the names
# bound near the cursor since then are read off the text (BOUND_NEAR).
STALE_DEFINITIONS = 64
# (`import` is not among them: an imported name is defined in another file, the one to look for)
BOUND_NEAR = re.compile(r"\b(?:def|class|for|as|function|let|const|var|fn)\s+([A-Za-z_]\w*)"
                        r"|\b([A-Za-z_]\w*)\s*(?::[^=\n]*)?=(?!=)")
SKIP_DIRS = frozenset({".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", "env", ".env",
                       "build", "dist", "target", ".tox", ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache",
                       "site-packages", ".idea", ".vscode", "vendor", "third_party", ".next", "coverage"})

# Per language family: lines that define a name (functions, classes, types, module-level constants).
_NAME = r"([A-Za-z_][A-Za-z0-9_]*)"
DEFINITION = {
    "python": re.compile(rf"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+{_NAME}|^{_NAME}[ \t]*(?::[^=\n]*)?=[^=]", re.M),
    # declarations at the top level or exported (an indented const is a local, not a definition)
    "ecmascript": re.compile(rf"^(?:[ \t]*export[ \t]+(?:default[ \t]+)?)?(?:declare[ \t]+)?(?:abstract[ \t]+)?"
                             rf"(?:async[ \t]+)?(?:function[ \t]*\*?|class|const|let|var|interface|type|enum)"
                             rf"[ \t]+(?!extends\b|implements\b){_NAME}", re.M),
    "go": re.compile(rf"^(?:func[ \t]+(?:\([^)]*\)[ \t]*)?|type[ \t]+|const[ \t]+|var[ \t]+){_NAME}", re.M),
    "rust": re.compile(rf"^[ \t]*(?:pub(?:\([^)]*\))?[ \t]+)?(?:(?:const|async|unsafe|extern[ \t]+\"[^\"]*\")[ \t]+)*"
                       rf"(?:fn|struct|enum|trait|type|const|static(?:[ \t]+mut)?|mod|union)[ \t]+{_NAME}", re.M),
}


def _skipped(folder: str) -> bool:
    """Vendored, generated and tool folders, and hidden ones."""
    return folder in SKIP_DIRS or folder.startswith(".")


def path_key(path) -> str:
    """One spelling per file (symlinks resolved), whether it comes from a scan, a URI or an event."""
    try:
        return os.path.realpath(path)
    except (ValueError, OSError):  # a NUL byte or a lone surrogate: no file has it, keep the spelling
        return str(path)


# Go's grouped declarations: `const (` ... `)`, one name at the start of each line inside.
GO_GROUP = re.compile(r"^(?:const|var|type)[ \t]*\(\n(.*?)^\)", re.M | re.S)
GO_GROUP_NAME = re.compile(rf"^[ \t]+{_NAME}", re.M)


def defined_names(text: str, family: str) -> frozenset[str]:
    pattern = DEFINITION.get(family)
    if pattern is None:
        return frozenset()
    names = {name for match in pattern.finditer(text) for name in match.groups() if name}
    if family == "go":
        names.update(m.group(1) for block in GO_GROUP.finditer(text) for m in GO_GROUP_NAME.finditer(block.group(1)))
    return frozenset(names)


class WorkspaceIndex:
    """Names defined per workspace file, and the reverse map; safe to query while it is being built."""

    def __init__(self, root: Path, language_of: dict[str, str] | None = None, max_files: int = MAX_FILES,
                 max_bytes: int = MAX_FILE_BYTES, max_seconds: float = MAX_SCAN_SECONDS):
        self.root = Path(path_key(root))
        # file suffix -> language id, for the languages with definitions to find
        self.language_of = {suffix: lang for suffix, lang in (language_of or languages.LANGUAGES_BY_SUFFIX).items()
                            if languages.FAMILY.get(lang) in DEFINITION}
        self.max_files, self.max_bytes, self.max_seconds = max_files, max_bytes, max_seconds
        self._files: dict[str, tuple[str, str, frozenset[str]]] = {}  # path -> (language, family, names)
        self._definers: dict[str, set[str]] = {}  # name -> paths
        self._documents = LRU(16)  # (path, mtime) -> Document, parsed on first use
        self._picks = LRU(64)  # uri -> the files last chosen for that document
        # uri -> (names already resolved for it, what the choice depended on): while the user types
        # names seen before, the choice stands without analysing the document again
        self._resolved = LRU(64)
        # uri -> (version, the names its last analysis found defined or bound, and those imported)
        self._defined = LRU(64)
        self._generation = 0  # counts changes of the index: a choice made before one is made again
        self._lock = threading.Lock()
        self.ready = threading.Event()

    def inside(self, key: str) -> bool:
        """Whether a resolved path lies under the root: a link that leads out of the workspace is
        not the workspace's file, and its text never enters a prompt."""
        root = str(self.root)
        return key == root or key.startswith(root.rstrip(os.sep) + os.sep)

    def _readable(self, path: Path) -> os.stat_result | None:
        """The file's stat if it may be read: under the root once links are resolved, a regular file
        (a pipe would block the reader), within the size limit; else None."""
        if not self.inside(path_key(path)):
            return None
        stat = path.stat()
        return stat if S_ISREG(stat.st_mode) and stat.st_size <= self.max_bytes else None

    # --- building -------------------------------------------------------------------------------

    def start(self) -> threading.Thread:
        """Scan in a background thread: the first requests go on without the workspace."""
        thread = threading.Thread(target=self.scan, name="memosight-workspace-scan", daemon=True)
        thread.start()
        return thread

    def scan(self) -> None:
        count = 0
        deadline = time.monotonic() + self.max_seconds
        try:
            for dirpath, dirnames, filenames in os.walk(self.root):
                dirnames[:] = sorted(d for d in dirnames if not _skipped(d))
                if time.monotonic() > deadline:
                    log.info("workspace index: stopped after %.0f s under %s", self.max_seconds, self.root)
                    return
                for name in sorted(filenames):
                    if count >= self.max_files:
                        log.info("workspace index: stopped at %d files under %s", count, self.root)
                        return
                    if Path(name).suffix in self.language_of:
                        count += self.update(Path(dirpath) / name)
        except OSError as exc:  # an unreadable workspace costs the index, never the server
            log.warning("workspace index: scanning %s failed: %s", self.root, exc)
        finally:
            log.info("workspace index: %d files, %d names under %s", len(self._files), len(self._definers), self.root)
            self.ready.set()

    def update(self, path: Path) -> bool:
        """(Re)read one file; returns whether it is indexed."""
        language = self.language_of.get(path.suffix)
        family = languages.FAMILY.get(language or "")
        try:
            if family is None or self._readable(path) is None:
                self.remove(path)
                return False
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            self.remove(path)
            return False
        names = defined_names(text, family)
        key = path_key(path)
        with self._lock:
            self._forget(key)
            self._generation += 1
            self._files[key] = (language, family, names)
            for name in names:
                self._definers.setdefault(name, set()).add(key)
        return True

    def remove(self, path: Path) -> None:
        with self._lock:
            self._forget(path_key(path))
            self._generation += 1

    def covers(self, path: Path) -> bool:
        """Whether a file a client reports belongs in the index: under the root, in no skipped
        folder, of an indexed language (a package installed into .venv sends thousands of events)."""
        try:
            relative = Path(path_key(path)).relative_to(self.root)
        except ValueError:
            return False
        folders = relative.parts[:-1]
        return path.suffix in self.language_of and not any(_skipped(part) for part in folders)

    def _forget(self, key: str) -> None:
        old = self._files.pop(key, None)
        if old is not None:
            for name in old[2]:
                paths = self._definers.get(name)
                if paths is not None:
                    paths.discard(key)
                    if not paths:
                        del self._definers[name]

    def __len__(self) -> int:
        return len(self._files)

    # --- queries --------------------------------------------------------------------------------

    def definers(self, names: set[str], family: str, exclude: set[str] = frozenset(), limit: int = 3) -> list[str]:
        """Paths of up to `limit` files of `family` defining the most of `names`, a name defined in
        fewer files counting more; files in `exclude` (the current and open ones) are left out."""
        scores: dict[str, float] = {}
        exclude = {path_key(p) for p in exclude}
        with self._lock:
            for name in names:
                paths = [p for p in self._definers.get(name, ()) if p not in exclude and self._files[p][1] == family]
                if not paths or len(paths) > MAX_DEFINERS:
                    continue
                for path in paths:
                    scores[path] = scores.get(path, 0.0) + 1.0 / len(paths)
        return sorted(scores, key=lambda p: (-scores[p], p))[:limit]

    def documents_for(self, doc, cursor: int, open_docs: list) -> list:
        """The files defining the names used near `cursor` in `doc` that neither it nor an open
        document defines, as Documents. The choice sticks while it still covers those names: other
        files change the far part of the prompt, and with it the KV cache, so it moves only for a
        name it does not cover."""
        family = languages.FAMILY.get(doc.language)
        if family is None or not self._files:
            return []
        start = max(0, cursor - NEAR_CHARS)
        before = doc.text[start:cursor]
        typing = len(before) - len(before.rstrip(IDENTIFIER_CHARS))  # a name still being typed
        names = identifiers(before[:len(before) - typing] + " " + doc.text[cursor:cursor + NEAR_CHARS // 4])
        exclude = {path_key(doc.path), *(path_key(o.path) for o in open_docs)}
        depends = (frozenset(exclude), self._generation)
        resolved = self._resolved.get(doc.uri)
        if resolved is not None and resolved[1] == depends and names <= resolved[0]:
            # no name the last choice did not see: it stands (and no parse or analysis of a long file
            # is paid on this keystroke)
            return self.documents_at(self._picks.get(doc.uri, []))
        seen = set(names)
        # what this file defines or assigns needs no other file (imports do)
        defined, imported = self._names_of(doc)
        # ... and a builtin needs none, unless this file imports a name of that spelling from one
        names -= defined | {a or b for a, b in BOUND_NEAR.findall(before)} \
            | (languages.BUILTINS.get(family, frozenset()) - imported)
        picked = self.definers(names, family, exclude=exclude)
        # the last choice, less files since opened in the editor (their open text is used) or gone
        previous = [p for p in self._picks.get(doc.uri, []) if p not in exclude and p in self._files]
        if previous and set(picked) <= set(previous):
            picked = previous
        self._picks.put(doc.uri, picked)
        self._resolved.put(doc.uri, (seen | (resolved[0] if resolved is not None and resolved[1] == depends
                                             else set()), depends))
        return self.documents_at(picked)

    def _names_of(self, doc) -> tuple[set[str], set[str]]:
        """(defined or bound, imported) in `doc`, from an analysis at most STALE_DEFINITIONS edits old."""
        cached = self._defined.get(doc.uri)
        if cached is not None and 0 <= doc.version - cached[0] <= STALE_DEFINITIONS:
            return cached[1], cached[2]
        text, tree = doc.snapshot()
        if tree is None:
            return set(), set()
        here = analyze(text, tree, doc.language)  # cached: the compressor asks for the same
        defined = set(here.symbols.keys()) | set(here.binds)
        imported = set(here.imports)
        self._defined.put(doc.uri, (doc.version, defined, imported))
        return defined, imported

    def documents_at(self, paths: list[str]) -> list:
        """Indexed files as Documents (read and parsed once per modification time)."""
        out = []
        for key in paths:
            path = Path(key)
            try:
                stat = self._readable(path)  # it may have become a link out, a pipe or huge since
                if stat is None:
                    continue
                mtime = stat.st_mtime_ns
                doc = self._documents.get((key, mtime))
                if doc is None:
                    doc = Document(path.as_uri(), path.read_text(encoding="utf-8"), self._files[key][0])
                    self._documents.put((key, mtime), doc)
            except (OSError, UnicodeDecodeError, KeyError):
                continue  # deleted or changed under us: the next scan of it settles it
            out.append(doc)
        return out
