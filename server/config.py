"""Settings: `.memosight.toml` or `[tool.memosight]` in pyproject.toml at the workspace root, then
editor settings (initializationOptions, then workspace/configuration section `memosight`) on top.

Every key is validated on its own: a bad value is reported (key and reason) and that key keeps its
default, so one typo never takes the server down or throws away the other keys.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memosight.engine import catalog_names
from memosight.engine.protocol import BackendSpec, EngineSpec

CONFIG_FILE = ".memosight.toml"
MAX_ERRORS = 20  # per source: a table of thousands of bad keys is not thousands of messages
MAX_CONFIG_BYTES = 1024 * 1024  # a pyproject.toml is a few KiB; a bigger file is not read


Backend = BackendSpec  # the `[backend]` table: the engine's own type, so it crosses the door as it is


# The engine's keys, each a key of its own in the config, held together as the engine's own type:
# model (folder, GGUF file, catalog name or Hugging Face id; None = the embedded one), draft_model
# (a small model with the same tokenizer that drafts for it), device ("auto": CUDA when available,
# "cpu", "cuda", "cuda:N"), dtype ("auto": on a CPU measured once per CPU and model, bf16/fp16 on a
# GPU; "int8", "float32", "bfloat16", "float16"), runtime ("auto": llama.cpp for a GGUF file on a
# CPU; "torch", "llamacpp") and backend (a remote serving engine; from a project file only when
# trusted).
ENGINE_KEYS = ("model", "draft_model", "device", "dtype", "runtime", "backend")
DEFAULT_ENGINE = EngineSpec(device="auto", dtype="auto")


@dataclass(frozen=True)
class Settings:
    engine: EngineSpec = DEFAULT_ENGINE  # what runs the model (ENGINE_KEYS); a change reloads it
    max_new_tokens: int = 64  # upper bound on one completion's length in tokens (single lines: 32 at most)
    multiline: str = "auto"  # "auto" | "always" | "never"
    context_budget: int = 1024  # prompt tokens (prefix + suffix) given to the model
    suffix_share: float = 0.25  # share of the budget given to the text after the cursor
    # ... and at most this many tokens: every keystroke before the suffix prefills it again (its KV
    # was computed against the old prefix), so its length is latency. Shorter lost quality (Qwen2.5-
    # Coder-0.5B, held-out code, next line's loss against 256: none +2%, 128 +5%, 16-64 +7-14%;
    # cursors mid-function none +11%): docs/BENCHMARKS.md, "The suffix's length"
    suffix_tokens: int = 256
    languages: tuple[str, ...] = ()  # language ids to complete; empty = all
    speculative: bool = True  # speculative decoding (identical output, faster)
    token_healing: bool = True  # end the prompt at a token boundary; the model first writes the text cut off
    prefill_on_edit: bool = True  # compute the likely next prompt as soon as an edit lands
    # every prompt computed exactly; else (llama.cpp) a keystroke moves the cells of text that only
    # moved, past their first tokens, and a pause makes them exact (engine/runtime/llamacpp_prompt.py)
    exact_prompt: bool = False
    prefetch: bool = True  # compute the suggestion that follows taking the one on screen, while it is read
    kv_cache_mb: int = 256  # memory bound of the cross-request KV prefix cache
    latency_budget_ms: int = 100  # after this a completion ends (multi-line: at its last complete line; 0 = off)
    # a single line ends before the first token the model gives less than this probability (0 = off)
    min_confidence: float = 0.0
    log_level: str = "info"  # "debug" | "info" | "warning" | "error"
    trusted_workspace: bool = False  # said by the editor only (VS Code workspace trust, Neovim :trust)

    @classmethod
    def of(cls, **keys: Any) -> Settings:
        """Settings from config keys (valid ones): the engine's go into its EngineSpec."""
        engine = {key: keys.pop(key) for key in ENGINE_KEYS if key in keys}
        return cls(engine=dataclasses.replace(DEFAULT_ENGINE, **engine), **keys)


@dataclass(frozen=True)
class ConfigError:
    key: str
    reason: str
    source: str

    def message(self) -> str:
        return f"MemoSight: invalid setting `{self.key}` in {self.source}: {self.reason}. Using the default."


def _choice(*options: str):
    def check(value: Any) -> str:
        if not isinstance(value, str) or value.lower() not in options:
            raise ValueError(f"must be one of {', '.join(repr(o) for o in options)}, got {value!r}")
        return value.lower()
    return check


def _int_range(low: int, high: int):
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be a whole number, got {value!r}")
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}, got {value}")
        return value
    return check


def _float_range(low: float, high: float):
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"must be a number, got {value!r}")
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}, got {value}")
        return float(value)
    return check


def _model(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"must be a folder path, a GGUF file, a catalog name (`memosight model list`) or a "
                         f"Hugging Face id (a string), got {value!r}")
    return value


def _device(value: Any) -> str:
    if not isinstance(value, str) or not (value in ("auto", "cpu", "cuda", "mps") or value.startswith("cuda:")):
        raise ValueError(f"must be \"auto\", \"cpu\", \"cuda\" or \"cuda:N\", got {value!r}")
    return value


def _languages(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"must be a list of language ids such as [\"python\", \"rust\"], got {value!r}")
    return tuple(value)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {value!r}")
    return value


def _backend(value: Any) -> Backend:
    if not isinstance(value, dict):
        raise ValueError(f"must be a table (kind, url, model, ...), got {value!r}")
    checks = {"kind": _choice("local", "openai", "llamacpp"), "url": _text, "model": _text, "tokenizer": _text,
              "api_key_env": _env_name, "timeout_ms": _int_range(100, 600_000),
              "first_token_timeout_ms": _int_range(100, 600_000), "ca_bundle": _text,
              "fallback": _choice("local", "none")}
    out = {}
    for key, item in value.items():
        name = _normalise_key(str(key))
        if name in ("api_key", "key", "token"):
            raise ValueError(f"`{key}` would put a secret in a settings file: put the key in an environment "
                             "variable and name the variable in backend.api_key_env")
        if name not in checks:
            raise ValueError(f"unknown key backend.{key} (known: {', '.join(checks)})")
        try:
            out[name] = checks[name](item)
        except ValueError as exc:
            raise ValueError(f"backend.{key} {exc}") from None
    backend = Backend(**out)
    if backend.remote and not backend.url.startswith(("http://", "https://")):
        raise ValueError(f"backend.url must be an http:// or https:// URL for kind {backend.kind!r}, "
                         f"got {backend.url!r}")
    return backend


def _text(value: Any) -> str:
    if not isinstance(value, str) or len(value) > 2000:
        raise ValueError(f"must be a string, got {value!r}")
    return value


def _env_name(value: Any) -> str:
    if not isinstance(value, str) or (value and not value.replace("_", "a").isalnum()):
        raise ValueError("must be the NAME of an environment variable (letters, digits, _), not the key itself")
    return value


VALIDATORS = {
    "model": _model,
    "draft_model": _model,
    "device": _device,
    "dtype": _choice("auto", "int8", "float32", "bfloat16", "float16"),
    "runtime": _choice("auto", "torch", "llamacpp"),
    "max_new_tokens": _int_range(1, 1024),
    "multiline": _choice("auto", "always", "never"),
    "context_budget": _int_range(64, 32768),
    "suffix_share": _float_range(0.0, 0.9),
    "suffix_tokens": _int_range(0, 32768),
    "languages": _languages,
    "speculative": _bool,
    "token_healing": _bool,
    "prefill_on_edit": _bool,
    "exact_prompt": _bool,
    "prefetch": _bool,
    "kv_cache_mb": _int_range(0, 65536),
    "latency_budget_ms": _int_range(0, 60000),
    "min_confidence": _float_range(0.0, 0.99),
    "log_level": _choice("debug", "info", "warning", "error"),
    "backend": _backend,
    "trusted_workspace": _bool,
}
assert set(VALIDATORS) == {f.name for f in dataclasses.fields(Settings)} - {"engine"} | set(ENGINE_KEYS)


def _normalise_key(key: str) -> str:
    # Editors send camelCase (maxNewTokens), TOML files use snake_case or kebab-case.
    out = "".join("_" + c.lower() if c.isupper() else c for c in key)
    return out.replace("-", "_")


def validate(raw: dict[str, Any], source: str) -> tuple[dict[str, Any], list[ConfigError]]:
    """The valid keys of `raw`, and an error for every key or value that is not."""
    values: dict[str, Any] = {}
    errors: list[ConfigError] = []
    if not isinstance(raw, dict):
        return values, [ConfigError("memosight", f"must be a table of settings, got {type(raw).__name__}", source)]
    for key, value in raw.items():
        if len(errors) >= MAX_ERRORS:
            errors.append(ConfigError("...", f"more than {MAX_ERRORS} errors; only these are listed", source))
            break
        key = str(key)[:100]
        name = _normalise_key(key)
        if name not in VALIDATORS:
            known = ", ".join(sorted(VALIDATORS))
            errors.append(ConfigError(key, f"unknown key (known keys: {known})", source))
            continue
        try:
            values[name] = VALIDATORS[name](value)
        except RecursionError:
            errors.append(ConfigError(key, "the value is nested too deeply", source))
        except ValueError as exc:
            reason = str(exc)
            errors.append(ConfigError(key, reason if len(reason) <= 300 else reason[:300] + "...", source))
    return values, errors


def find_config_file(root: Path) -> tuple[Path | None, str]:
    """The config file that applies at the workspace root, and which table in it to read."""
    own = root / CONFIG_FILE
    if own.is_file():
        return own, ""
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        return pyproject, "tool.memosight"
    return None, ""


def read_config_file(root: Path | None) -> tuple[dict[str, Any], list[ConfigError]]:
    if root is None:
        return {}, []
    path, table = find_config_file(root)
    if path is None:
        return {}, []
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ValueError(f"it is over {MAX_CONFIG_BYTES // 1024} KiB")
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        return {}, [ConfigError(path.name, "cannot be read (it is nested too deeply); fix the file", str(path))]
    except (tomllib.TOMLDecodeError, ValueError, OSError) as exc:  # UnicodeDecodeError is a ValueError
        return {}, [ConfigError(path.name, f"cannot be read ({exc}); fix the file", str(path))]
    for part in table.split(".") if table else []:
        data = data.get(part, {}) if isinstance(data, dict) else {}
    return validate(data, str(path))


@dataclass
class ConfigSources:
    """The layers that make up the settings, lowest first, and when the file was last read."""

    root: Path | None = None
    file_values: dict[str, Any] = field(default_factory=dict)
    init_values: dict[str, Any] = field(default_factory=dict)
    client_values: dict[str, Any] = field(default_factory=dict)
    file_stamp: tuple[str, float] | None = None

    def stamp(self) -> tuple[str, float] | None:
        if self.root is None:
            return None
        path, _ = find_config_file(self.root)
        if path is None:
            return None
        try:
            return str(path), path.stat().st_mtime
        except OSError:
            return None

    def reload_file(self) -> list[ConfigError]:
        self.file_values, errors = read_config_file(self.root)
        self.file_stamp = self.stamp()
        return errors

    def file_changed(self) -> bool:
        return self.stamp() != self.file_stamp

    def sets(self, key: str) -> bool:
        """Whether any layer gives `key` a value (rather than leaving the default)."""
        return any(key in layer for layer in (self.file_values, self.init_values, self.client_values))

    def trusted(self) -> bool:
        """Whether the user trusts this workspace: the editor says so (never the project's own
        file), or the workspace is in the user's allow-list file."""
        said = {**self.init_values, **self.client_values}.get("trusted_workspace", False)
        return bool(said) or (self.root is not None and self.root.resolve() in allowed_workspaces())

    def untrusted_file_keys(self) -> list[str]:
        """Project-file keys ignored because the workspace is not trusted: those that would send
        code off the machine, and the file's own claim to be trusted."""
        ignored = ["trusted_workspace"] if "trusted_workspace" in self.file_values else []
        backend = self.file_values.get("backend")
        if backend is not None and backend.remote and not self.trusted():
            ignored.append("backend")
        return ignored

    def trust_notices(self) -> list[str]:
        ignored = self.untrusted_file_keys()
        return [f"MemoSight: ignored `{', '.join(ignored)}` in the project's config file: a project file can send "
                "your code to a server only in a workspace you trust (VS Code: trust the workspace; Neovim: "
                f"`:trust` it; or add its folder to {ALLOW_LIST_FILE}). Nothing is sent anywhere."] if ignored else []

    def settings(self) -> Settings:
        file_values = {k: v for k, v in self.file_values.items() if k not in self.untrusted_file_keys()}
        merged = {**self.anchored(file_values), **self.init_values, **self.client_values}
        return Settings.of(**merged)

    def anchored(self, values: dict[str, Any]) -> dict[str, Any]:
        """The project file's relative model paths resolved against the workspace root, where the
        file is: the server's own working directory is wherever the editor was started from."""
        if self.root is None:
            return values
        out = dict(values)
        for key in PATH_KEYS:
            value = out.get(key)
            if isinstance(value, str) and _relative_path(value, self.root):
                out[key] = str(self.root / value)
        return out


PATH_KEYS = ("model", "draft_model")


def _relative_path(value: str, root: Path) -> bool:
    """Whether a model value is a path relative to the workspace (not a catalog or packaged name or a
    Hugging Face id such as 'org/name'): it exists there, or says it is a path (./, ../, a .gguf file).
    A catalog name (`memosight model list`) is a name even where a folder of that name exists."""
    if not value or Path(value).is_absolute() or value.startswith("~") or value in catalog_names():
        return False
    return value.startswith(("./", "../", ".\\", "..\\")) or value.lower().endswith(".gguf") or (root / value).exists()


ALLOW_LIST_FILE = "~/.config/memosight/trusted-workspaces"  # one folder per line


def allowed_workspaces() -> set[Path]:
    """The folders in the user's allow-list file (a user-level file: no repository can add to it)."""
    path = Path(ALLOW_LIST_FILE).expanduser()
    try:
        lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    except (OSError, ValueError):
        return set()
    return {Path(line.strip()).expanduser().resolve() for line in lines if line.strip() and not line.startswith("#")}
