import json

from memosight.server.cli import main


def test_context_command_prints_the_packed_context_as_json(tmp_path, tiny_model_dir, capsys):
    source = tmp_path / "m.py"
    helpers = "".join(f"def helper_{i}(x):\n    return x + {i}\n\n\n" for i in range(200))
    source.write_text("LIMIT = 7919\n\n\n" + helpers + "def use(items):\n    n = helper_3(LIMIT)\n    \n")
    line = source.read_text().count("\n")  # the last, indented line
    assert main(["context", f"{source}:{line}:5", "--budget", "128", "--model", str(tiny_model_dir),
                 "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"prefix", "suffix", "prompt_tokens", "regions"} and 0 < out["prompt_tokens"] <= 128
    assert "LIMIT = 7919" in out["prefix"] and "def helper_3(x):" in out["prefix"]
    assert out["prefix"].endswith("def use(items):\n    n = helper_3(LIMIT)\n    ")
    assert {r["kind"] for r in out["regions"]} >= {"cursor_prefix", "variable", "signature"}
    assert all(r["path"] == str(source.resolve()) for r in out["regions"])


def test_other_open_files_feed_the_context(tmp_path, tiny_model_dir, capsys):
    (tmp_path / "util.py").write_text("def far_helper(count, scale=3):\n    return count * scale\n")
    main_file = tmp_path / "main.py"
    main_file.write_text("def use(items):\n    n = far_helper(len(items))\n    \n")
    assert main(["context", f"{main_file}:3:5", "--budget", "128", "--open", str(tmp_path / "util.py"),
                 "--model", str(tiny_model_dir), "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "def far_helper(count, scale=3):" in out["prefix"]
    assert any(r["path"].endswith("util.py") for r in out["regions"])


def test_workspace_files_feed_the_context_without_being_opened(tmp_path, tiny_model_dir, capsys):
    (tmp_path / "util.py").write_text("def far_helper(count, scale=3):\n    return count * scale\n")
    main_file = tmp_path / "main.py"
    main_file.write_text("def use(items):\n    n = far_helper(len(items))\n    \n")
    common = [f"{main_file}:3:5", "--budget", "128", "--model", str(tiny_model_dir), "--device", "cpu", "--json"]
    assert main(["context", *common]) == 0
    assert "def far_helper" not in json.loads(capsys.readouterr().out)["prefix"]
    assert main(["context", *common, "--workspace", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "def far_helper(count, scale=3):" in out["prefix"]
    assert main(["context", *common, "--workspace", str(tmp_path / "nope")]) == 2
