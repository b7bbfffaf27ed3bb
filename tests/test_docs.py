"""The docs say only what the code does: every `memosight` / `memosight-lsp` command and flag they
show parses, the README's settings table and server/config.py name the same keys, every relative
link resolves, and every VS Code setting is in the extension's README."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from memosight.server import __main__ as lsp_main
from memosight.server import cli, config

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "editors" / "vscode" / "README.md", ROOT / "editors" / "nvim" / "README.md"]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`([^`]{1,600})`")  # a span may run over a line break


def _command_lines(text: str) -> list[str]:
    """Lines and inline spans that run memosight or memosight-lsp (the part from that word on)."""
    pieces = [line for block in FENCE.findall(text) for line in block.splitlines()]
    pieces += [span.replace("\n", " ") for span in SPAN.findall(FENCE.sub("", text))]
    found = []
    for piece in pieces:
        for part in re.split(r"&&|\|\||;|\|", piece):
            words = part.strip().split()
            if words and words[0].lstrip("$") in ("memosight", "memosight-lsp"):
                found.append(part.strip().lstrip("$ "))
    return found


def _options(parser) -> set[str]:
    return {o for action in parser._actions for o in action.option_strings}


def _subparser(parser, words: list[str]):
    """The parser of the subcommand `words` start with, and the words after it."""
    while True:
        choices = next((a.choices for a in parser._actions if getattr(a, "choices", None) and
                        isinstance(a.choices, dict)), None)
        if not choices or not words or words[0] not in choices:
            return parser, words
        parser, words = choices[words[0]], words[1:]


def _flags(words: list[str]) -> list[str]:
    """The long options among `words` ("--heavy/--no-heavy": both; "--set=K=V": --set)."""
    return [f.split("=", 1)[0] for w in words for f in w.split("/")
            if f.startswith("--") and len(f) > 2 and f[2].isalpha()]


def _words(line: str) -> list[str]:
    line = re.sub(r"[\[\]]", " ", line.replace("...", " "))
    try:
        return shlex.split(line, comments=True)
    except ValueError:  # an unclosed quote in prose: plain words will do
        return line.split()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_and_flag_in_the_docs_exists(doc):
    memosight, lsp = cli.build_parser(), lsp_main_parser()
    wrong = []
    for line in _command_lines(doc.read_text()):
        words = _words(line)
        if not words:
            continue
        if words[0] == "memosight-lsp":
            parser, rest = lsp, words[1:]
        else:
            parser, rest = _subparser(memosight, words[1:])
            if parser is memosight and rest and rest[0].isidentifier() and not rest[0].isupper():  # COMMAND: a placeholder
                wrong.append(f"{line!r}: no command {rest[0]!r}")
                continue
        unknown = [f for f in _flags(rest) if f not in _options(parser)]
        if unknown:
            wrong.append(f"{line!r}: {', '.join(unknown)} unknown to `{parser.prog}`")
    assert not wrong, "\n".join(wrong)


def lsp_main_parser():
    """memosight-lsp's own parser (parse_args builds it): caught at its parse."""
    import argparse

    captured = {}
    real = argparse.ArgumentParser.parse_args

    def keep(self, args=None, namespace=None):
        captured["parser"] = self
        return real(self, [], namespace)

    argparse.ArgumentParser.parse_args = keep
    try:
        lsp_main.parse_args([])
    finally:
        argparse.ArgumentParser.parse_args = real
    return captured["parser"]


def test_the_readme_settings_table_names_every_setting_and_no_other():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", section, re.M))
    known = set(config.VALIDATORS)  # every key a config file or an editor may set
    assert documented == known, (sorted(documented - known), sorted(known - documented))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        path = target.split("#", 1)[0]
        if not path or re.match(r"[a-z]+:", path):
            continue
        if not (doc.parent / path).exists():
            broken.append(target)
    assert not broken, broken


def test_every_vscode_setting_is_in_its_readme():
    package = json.loads((ROOT / "editors" / "vscode" / "package.json").read_text())
    settings = package["contributes"]["configuration"]["properties"]
    readme = (ROOT / "editors" / "vscode" / "README.md").read_text()
    missing = [name for name in settings if f"`{name}`" not in readme]
    assert not missing, missing
