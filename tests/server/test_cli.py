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


def test_sigterm_ends_a_command_through_its_cleanup(tmp_path):
    """A benchmark killed with SIGTERM (a `kill`, a timeout) closes the servers it started, as on Ctrl-C."""
    import signal
    import subprocess
    import sys

    marker = tmp_path / "closed"
    code = ("import pathlib, sys, time\n"
            "from memosight.server import cli\n"
            "class Command:\n"
            "    @staticmethod\n"
            "    def run(args):\n"
            "        try:\n"
            "            print('ready', flush=True)\n"
            "            time.sleep(60)\n"
            "        finally:\n"
            "            pathlib.Path(sys.argv[1]).write_text('closed')\n"
            "parser = cli.build_parser()\n"
            "cli.build_parser = lambda: parser\n"
            "cli._load = lambda name: Command\n"
            "sys.exit(cli.main(['model', 'list']))\n")
    process = subprocess.Popen([sys.executable, "-c", code, str(marker)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 143 and "terminated" in err
    assert marker.read_text() == "closed"
