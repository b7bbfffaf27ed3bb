"""The training corpus: permissively licensed source files present on this machine.

A corpus is a list of `CorpusFile`s gathered from `Source`s (a folder plus its licence),
deduplicated by the xxhash of their content and split into train and validation *by file*: a file
is held out when its content hash falls in the validation fraction, so the split is the same on
every machine and every run, and two copies of one file never land on both sides.

Sources are named on the command line: `stdlib` (the Python standard library of the running
interpreter), `site` (a curated list of permissively licensed packages installed next to it), or
any folder (licence recorded as "as given"). Nothing we evaluate on (attrs, click, requests) is
ever admitted: `EXCLUDED_NAMES` is checked against every path component.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import xxhash

from ..protocol import EngineError

MAX_FILE_BYTES = 200_000  # bigger files are generated tables or giant test suites
SPECIAL_STRINGS = ("<|endoftext|>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>")
# Packages we evaluate on (and copies of them vendored elsewhere): never trained on.
EXCLUDED_NAMES = frozenset({"attr", "attrs", "click", "requests", "urllib3", "pip", "_vendor", "vendored"})
# Folders of generated or deliberately broken code inside the standard library.
STDLIB_SKIP_DIRS = frozenset({"site-packages", "__pycache__", "encodings", "lib2to3", "data", "pydoc_data",
                              "crashers", "leakers", "tokenizedata", "test_lib2to3", "idlelib", "turtledemo",
                              "config-3.11-x86_64-linux-gnu"})
STDLIB_SKIP_PREFIXES = ("bad", "_sysconfigdata")

# Permissively licensed packages installed next to the interpreter: (import folder or module, licence).
SITE_PACKAGES: tuple[tuple[str, str], ...] = (
    ("flask", "BSD-3-Clause"), ("werkzeug", "BSD-3-Clause"), ("jinja2", "BSD-3-Clause"),
    ("markupsafe", "BSD-3-Clause"), ("itsdangerous", "BSD-3-Clause"), ("blinker", "MIT"),
    ("pluggy", "MIT"), ("_pytest", "MIT"), ("packaging", "Apache-2.0 OR BSD-2-Clause"),
    ("trio", "MIT OR Apache-2.0"), ("jedi", "MIT"), ("parso", "MIT"), ("six.py", "MIT"),
    ("jsonschema", "MIT"), ("pydantic", "MIT"), ("prompt_toolkit", "BSD-3-Clause"), ("traitlets", "BSD-3-Clause"),
)


@dataclass(frozen=True)
class Source:
    """A folder (or single file) of source code and the licence it is distributed under."""

    name: str  # short label for the model card, e.g. "python-stdlib-3.11"
    root: Path
    licence: str
    skip_dirs: frozenset[str] = frozenset()
    skip_prefixes: tuple[str, ...] = ()
    # What the model card names: the package and its version, never a path of this machine.
    origin: str = ""


@dataclass(frozen=True)
class CorpusFile:
    path: str  # "<source name>/<path relative to the source root>"
    text: str
    digest: int  # xxh64 of the UTF-8 bytes; decides dedup and the split


@dataclass
class Corpus:
    train: list[CorpusFile]
    validation: list[CorpusFile]
    sources: list[Source]
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> file count

    def chars(self) -> int:
        return sum(len(f.text) for f in self.train)


def stdlib_source() -> Source:
    root = Path(sysconfig.get_paths()["stdlib"])
    return Source(f"python-stdlib-{root.name.removeprefix('python')}", root, "PSF-2.0",
                  STDLIB_SKIP_DIRS, STDLIB_SKIP_PREFIXES,
                  origin=f"Python {platform.python_version()} standard library")


def site_sources() -> list[Source]:
    """The curated packages, from this environment or else from the base interpreter's site-packages."""
    sites = [Path(sysconfig.get_paths()["purelib"]), Path(sysconfig.get_paths(vars={"base": sys.base_prefix})["purelib"])]
    sources = []
    for name, licence in SITE_PACKAGES:
        found = [site / name for site in sites if (site / name).exists()]
        if found:
            sources.append(Source(name.removesuffix(".py"), found[0], licence, origin=package_origin(found[0])))
    return sources


def package_origin(path: Path) -> str:
    """`path` (a package folder or module in site-packages) as its distribution and version, the
    import name added where it differs: "Flask 3.1.3 (site-packages)", "_pytest from pytest 9.0.3 (...)"."""
    dist, version = installed_distributions(path.parent).get(path.name, ("", ""))
    name = path.name.removesuffix(".py")
    if not dist:
        return f"{name} (site-packages, version unknown)"
    same = dist.lower().replace("-", "_") == name.lower()
    return f"{dist} {version} (site-packages)" if same else f"{name} from {dist} {version} (site-packages)"


@functools.cache
def installed_distributions(site: Path) -> dict[str, tuple[str, str]]:
    """Top-level package or module name (as on disk) -> (distribution, version), for one site-packages."""
    found: dict[str, tuple[str, str]] = {}
    for dist in importlib.metadata.distributions(path=[str(site)]):
        named = (dist.metadata["Name"], dist.version)
        for file in dist.files or ():  # RECORD: every file the distribution installed
            found.setdefault(file.parts[0], named)
    return found


def resolve_sources(specs: Iterable[str]) -> list[Source]:
    """`stdlib`, `site`, or a folder path -> Sources. A missing folder is an EngineError: the user
    mistyped it."""
    sources: list[Source] = []
    for spec in specs:
        if spec == "stdlib":
            sources.append(stdlib_source())
        elif spec == "site":
            sources.extend(site_sources())
        else:
            root = Path(spec).expanduser().resolve()
            if not root.exists():
                raise EngineError(f"corpus folder not found: {spec}")
            sources.append(Source(root.name, root, "as given (check before shipping)",
                                  origin=f"{root.name} (a folder given on the command line)"))
    return sources


def iter_source_paths(source: Source, extensions: tuple[str, ...],
                      excluded_names: frozenset[str] = EXCLUDED_NAMES) -> Iterator[Path]:
    if source.root.is_file():
        yield source.root
        return
    for dirpath, dirnames, filenames in os.walk(source.root):
        dirnames[:] = sorted(d for d in dirnames if d not in source.skip_dirs and d not in excluded_names)
        for name in sorted(filenames):
            if name.endswith(extensions) and not name.startswith(source.skip_prefixes):
                yield Path(dirpath) / name


def is_validation(digest: int, val_fraction: float) -> bool:
    return (digest % 10_000) < val_fraction * 10_000


def build_corpus(sources: list[Source], val_fraction: float = 0.03,
                 extensions: tuple[str, ...] = (".py",), max_bytes: int = MAX_FILE_BYTES,
                 excluded_names: frozenset[str] = EXCLUDED_NAMES) -> Corpus:
    """Read, filter, deduplicate and split. Deterministic: the same files give the same split."""
    corpus = Corpus([], [], sources)
    seen: set[int] = set()

    def skip(reason: str) -> None:
        corpus.skipped[reason] = corpus.skipped.get(reason, 0) + 1

    for source in sources:
        for path in iter_source_paths(source, extensions, excluded_names):
            if any(part in excluded_names for part in path.relative_to(source.root.parent).parts):
                skip("excluded package")
                continue
            raw = path.read_bytes()
            if len(raw) > max_bytes:
                skip("too big")
                continue
            if not raw.strip():
                skip("empty")
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                skip("not UTF-8")
                continue
            if any(s in text for s in SPECIAL_STRINGS):
                skip("contains a special token")
                continue
            digest = xxhash.xxh64_intdigest(raw)
            if digest in seen:
                skip("duplicate")
                continue
            seen.add(digest)
            rel = path.name if source.root.is_file() else path.relative_to(source.root).as_posix()
            record = CorpusFile(f"{source.name}/{rel}", text, digest)
            (corpus.validation if is_validation(digest, val_fraction) else corpus.train).append(record)
    return corpus


def read_folder(root: str | Path, extensions: tuple[str, ...] = (".py",), max_bytes: int = MAX_FILE_BYTES,
                max_files: int | None = None) -> list[CorpusFile]:
    """Every source file under `root` (no split, no exclusions): what the quality bench reads."""
    corpus = build_corpus([Source(Path(root).name, Path(root).resolve(), "as given")], val_fraction=0.0,
                          extensions=extensions, max_bytes=max_bytes, excluded_names=frozenset())
    files = sorted(corpus.train, key=lambda f: f.path)
    return files[:max_files] if max_files else files
