from pathlib import Path

from memosight.server.config import (
    Backend,
    ConfigSources,
    Settings,
    find_config_file,
    read_config_file,
    validate,
)


def test_valid_values_from_the_own_file(tmp_path: Path):
    (tmp_path / ".memosight.toml").write_text('model = "/models/big"\nmax_new_tokens = 32\nmultiline = "never"\n')
    values, errors = read_config_file(tmp_path)
    assert errors == []
    assert values == {"model": "/models/big", "max_new_tokens": 32, "multiline": "never"}


def test_pyproject_table_is_used_when_there_is_no_own_file(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.memosight]\ncontext-budget = 512\n')
    assert find_config_file(tmp_path)[1] == "tool.memosight"
    assert read_config_file(tmp_path) == ({"context_budget": 512}, [])


def test_each_bad_key_is_reported_and_the_others_kept():
    values, errors = validate({"max_new_tokens": -3, "multiline": "sometimes", "colour": "red",
                               "dtype": "float32", "speculative": "yes"}, "test")
    assert values == {"dtype": "float32"}
    reasons = {e.key: e.reason for e in errors}
    assert "between 1 and 1024" in reasons["max_new_tokens"]
    assert "'auto'" in reasons["multiline"]
    assert "unknown key" in reasons["colour"]
    assert "true or false" in reasons["speculative"]
    assert "`max_new_tokens`" in errors[0].message() and "default" in errors[0].message()


def test_unreadable_toml_is_one_clear_error(tmp_path: Path):
    (tmp_path / ".memosight.toml").write_text("model = \n")
    values, errors = read_config_file(tmp_path)
    assert values == {} and "cannot be read" in errors[0].reason


def test_editor_settings_override_init_options_override_the_file(tmp_path: Path):
    (tmp_path / ".memosight.toml").write_text("max_new_tokens = 10\ncontext_budget = 300\nmultiline = \"never\"\n")
    sources = ConfigSources(root=tmp_path)
    sources.reload_file()
    sources.init_values, _ = validate({"maxNewTokens": 20, "contextBudget": 400}, "init")
    sources.client_values, _ = validate({"maxNewTokens": 30}, "client")
    settings = sources.settings()
    assert (settings.max_new_tokens, settings.context_budget, settings.multiline) == (30, 400, "never")
    assert settings.engine.device == Settings().engine.device


def test_file_change_is_noticed(tmp_path: Path):
    import os
    import time

    path = tmp_path / ".memosight.toml"
    path.write_text("max_new_tokens = 10\n")
    sources = ConfigSources(root=tmp_path)
    sources.reload_file()
    assert not sources.file_changed()
    path.write_text("max_new_tokens = 11\n")
    os.utime(path, (time.time() + 5, time.time() + 5))
    assert sources.file_changed()
    sources.reload_file()
    assert sources.settings().max_new_tokens == 11


def test_latency_budget_is_validated():
    values, errors = validate({"latencyBudgetMs": -5, "max_new_tokens": 80}, "test")
    assert [e.key for e in errors] == ["latencyBudgetMs"]  # named as the user wrote it
    assert "between 0 and 60000" in errors[0].reason and values == {"max_new_tokens": 80}
    assert Settings().latency_budget_ms == 100


def _project_with_backend(tmp_path: Path) -> ConfigSources:
    (tmp_path / ".memosight.toml").write_text(
        'model = "./m"\n[backend]\nkind = "openai"\nurl = "http://stranger:8000/v1"\n')
    sources = ConfigSources(root=tmp_path)
    assert sources.reload_file() == []
    return sources


def test_a_backend_in_an_untrusted_project_file_is_ignored_and_said(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    sources = _project_with_backend(tmp_path)
    settings = sources.settings()  # the rest stays, its relative model path the workspace's
    assert settings.engine.backend == Backend() and settings.engine.model == str(sources.root / "./m")
    notice = sources.trust_notices()[0]
    assert "ignored `backend`" in notice and "trust" in notice and "Nothing is sent" in notice


def test_the_project_file_cannot_trust_itself(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / ".memosight.toml").write_text(
        'trusted_workspace = true\n[backend]\nkind = "llamacpp"\nurl = "http://stranger:8080"\n')
    sources = ConfigSources(root=tmp_path)
    sources.reload_file()
    assert sources.settings().engine.backend == Backend()
    assert "trusted_workspace, backend" in sources.trust_notices()[0]


def test_the_editor_or_the_users_allow_list_trusts_a_workspace(tmp_path: Path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    sources = _project_with_backend(tmp_path)
    sources.init_values, errors = validate({"trustedWorkspace": True}, "initializationOptions")
    assert errors == [] and sources.settings().engine.backend.url == "http://stranger:8000/v1"
    assert sources.trust_notices() == []
    sources.init_values = {}
    allow = home / ".config" / "memosight" / "trusted-workspaces"
    allow.parent.mkdir(parents=True)
    allow.write_text(f"# mine\n{tmp_path}\n")
    assert sources.settings().engine.backend.kind == "openai"


def test_editor_settings_may_name_a_backend_and_bad_backends_say_why():
    values, errors = validate({"backend": {"kind": "llamacpp", "url": "http://gpu:8080", "apiKeyEnv": "TEAM_KEY",
                                           "timeoutMs": 3000}}, "editor settings")
    assert errors == [] and values["backend"] == Backend(kind="llamacpp", url="http://gpu:8080",
                                                        api_key_env="TEAM_KEY", timeout_ms=3000)
    for bad, words in [({"kind": "openai"}, "backend.url must be an http"),
                       ({"kind": "grpc", "url": "http://x"}, "backend.kind must be one of"),
                       ({"kind": "openai", "url": "http://x", "api_key": "sk-1"}, "environment variable"),
                       ({"kind": "openai", "url": "http://x", "apiKeyEnv": "sk-123 456"}, "NAME of an environment"),
                       ({"kind": "openai", "url": "http://x", "port": 1}, "unknown key backend.port"),
                       ("http://x", "must be a table")]:
        _, errors = validate({"backend": bad}, "editor settings")
        assert len(errors) == 1 and words in errors[0].reason, (bad, errors)
        assert "sk-1" not in errors[0].reason


def test_relative_model_paths_in_the_project_file_are_the_workspaces(tmp_path: Path, monkeypatch):
    import pytest
    from memosight.engine.protocol import EngineError
    from memosight.server.config import ConfigSources

    root = tmp_path / "project"
    (root / "models" / "mine").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the editor started the server somewhere else
    sources = ConfigSources(root=root)
    for value, expected in [("models/mine", str(root / "models/mine")), ("./x.gguf", str(root / "./x.gguf")),
                            ("models/missing.gguf", str(root / "models/missing.gguf")),
                            ("smollm2-135m", "smollm2-135m"), ("org/name", "org/name"),
                            (str(root / "models/mine"), str(root / "models/mine"))]:
        sources.file_values = {"model": value}
        assert sources.settings().engine.model == expected, value
    sources.file_values, sources.client_values = {}, {"model": "models/mine"}  # the editor's: as it says
    assert sources.settings().engine.model == "models/mine"
    from memosight.engine import load_engine

    with pytest.raises(EngineError) as info:  # the message names the path it tried
        load_engine(str(root / "models/missing.gguf"))
    assert str(root / "models" / "missing.gguf") in str(info.value)
