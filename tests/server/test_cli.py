"""The `memosight` command: every tool in one table, one way to fail, help without torch."""

import importlib
import subprocess
import sys

import pytest
from memosight.server.cli import COMMANDS, build_parser, main
from memosight.server.commands.common import CommandError


def test_every_tool_is_a_command_module_with_arguments_and_a_description(capsys):
    parser = build_parser()
    for path in COMMANDS:
        with pytest.raises(SystemExit) as done:
            parser.parse_args([*path, "--help"])
        assert done.value.code == 0, path
        shown = capsys.readouterr().out
        assert "usage: memosight " + " ".join(path) in shown and COMMANDS[path][1][:20] in shown
        module = importlib.import_module(f"memosight.server.commands.{COMMANDS[path][0]}")
        assert callable(module.add_arguments) and callable(module.run) and module.__doc__

def test_help_imports_no_torch():
    code = ("import sys; from memosight.server.cli import build_parser; build_parser(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_command_error_is_one_line_and_exit_status_2(monkeypatch, capsys):
    import memosight.server.commands.complete as complete

    def fail(args):
        raise CommandError("the file is gone; give another")

    monkeypatch.setattr(complete, "run", fail)
    assert main(["complete", "a.py:1:1"]) == 2
    assert capsys.readouterr().err == "memosight: the file is gone; give another\n"


def test_unknown_commands_are_refused_by_argparse(capsys):
    with pytest.raises(SystemExit) as done:
        main(["nonsense"])
    assert done.value.code == 2 and "invalid choice" in capsys.readouterr().err
