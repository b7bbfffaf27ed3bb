"""editors/vscode builds from its lock file, its unit tests pass (node's test runner, no VS Code needed),
it packages into a .vsix, the settings it contributes are the server's settings with the server's
defaults, and, end to end, the compiled extension drives a real memosight-lsp.

VS Code itself cannot be downloaded here, so the end-to-end test loads out/extension.js in node with a
stand-in for the `vscode` module (DRIVER_JS): the real vscode-languageclient starts the real server,
registers the providers and the server's commands with the stand-in, and the driver calls them the way
VS Code does (ask for an inline completion, run the item's command on accept, click the status bar,
restart), writing what it saw as JSON for the assertions here.

The tests marked `npm` build the extension first: `npm ci` and `tsc` in editors/vscode, about 10 s
of the suite with npm's cache warm and a minute or more cold (it downloads about 80 MB of packages from
the npm registry the first time, 167 MB in node_modules). CI runs them as part of the README's test command; locally
`python -m pytest -m "not npm"` leaves them out.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from memosight.server.config import VALIDATORS, Settings, validate

EXTENSION_DIR = Path(__file__).resolve().parents[2] / "editors" / "vscode"
MANIFEST = json.loads((EXTENSION_DIR / "package.json").read_text())
CLIENT_ONLY_SETTINGS = {"serverPath", "pythonPath", "trace.server"}  # read by the extension, never sent
MAX_NEW_TOKENS = 8
SOURCE = 'def greet(name):\n    message = "hello " + name\n    return \n'

DRIVER_JS = r""""use strict";
const Module = require("module");
const path = require("path");
const fs = require("fs");

const EXT = process.env.MEMOSIGHT_EXTENSION_DIR;
const RESULT = process.env.MEMOSIGHT_RESULT;
const out = { events: [], registered: [], errors: [], output: [], statusBar: [] };
const started = Date.now();
const note = (msg) => out.events.push(`${((Date.now() - started) / 1000).toFixed(2)}s ${msg}`);

class Disposable {
  constructor(fn) { this._fn = fn; }
  static from(...items) { return new Disposable(() => items.forEach((d) => d && d.dispose && d.dispose())); }
  dispose() { if (this._fn) { this._fn(); this._fn = undefined; } }
}
class EventEmitter {
  constructor() { this.listeners = new Set(); this.event = (fn, thisArg) => { const l = fn.bind(thisArg); this.listeners.add(l); return new Disposable(() => this.listeners.delete(l)); }; }
  fire(e) { for (const l of [...this.listeners]) l(e); }
  dispose() { this.listeners.clear(); }
}
const noEvent = () => new Disposable();
class Uri {
  constructor(scheme, p) { this.scheme = scheme; this.path = p; this.fsPath = p; this.authority = ""; this.query = ""; this.fragment = ""; }
  static file(p) { return new Uri("file", p); }
  static parse(s) { const m = /^([a-z]+):\/\/(.*)$/.exec(s); return m ? new Uri(m[1], decodeURIComponent(m[2])) : new Uri("file", s); }
  toString() { return `${this.scheme}://${this.path.split("/").map(encodeURIComponent).join("/")}`; }
  toJSON() { return this.toString(); }
  with() { return this; }
}
class Position { constructor(line, character) { this.line = line; this.character = character; } }
class Range {
  constructor(a, b, c, d) { if (typeof a === "number") { a = new Position(a, b); b = new Position(c, d); } this.start = a; this.end = b; }
}
class InlineCompletionItem { constructor(insertText, range, command) { this.insertText = insertText; this.range = range; this.command = command; } }
class InlineCompletionList { constructor(items) { this.items = items; } }
class CancellationTokenSource {
  constructor() { const e = new EventEmitter(); this._e = e; this.token = { isCancellationRequested: false, onCancellationRequested: e.event }; }
  cancel() { this.token.isCancellationRequested = true; this._e.fire(); }
  dispose() {}
}
class CancellationError extends Error {}
class Generic { constructor(...args) { this.args = args; } }

const settings = JSON.parse(process.env.MEMOSIGHT_SETTINGS);  // what the user set, e.g. {"memosight.model": ...}
function configuration(section) {
  const full = (key) => (section ? `${section}.${key}` : key);
  const manifest = JSON.parse(fs.readFileSync(path.join(EXT, "package.json"), "utf8")).contributes.configuration.properties;
  const defaultOf = (key) => (manifest[full(key)] || {}).default;
  return {
    get: (key, dflt) => (full(key) in settings ? settings[full(key)] : defaultOf(key) ?? dflt),
    has: (key) => full(key) in settings || full(key) in manifest,
    inspect: (key) => ({ key: full(key), defaultValue: defaultOf(key), ...(full(key) in settings ? { globalValue: settings[full(key)] } : {}) }),
    update: async () => {},
  };
}

const commands = new Map();
const source = fs.readFileSync(process.env.MEMOSIGHT_FILE, "utf8");
const document = {
  uri: Uri.file(process.env.MEMOSIGHT_FILE), fileName: process.env.MEMOSIGHT_FILE, languageId: "python", version: 1,
  isClosed: false, isDirty: false, isUntitled: false, lineCount: source.split("\n").length,
  getText: () => source,
};
const providers = {};
const outputChannel = {
  name: "MemoSight", logLevel: 2, onDidChangeLogLevel: noEvent,
  append: (s) => out.output.push(s), appendLine: (s) => out.output.push(s), replace() {}, clear() {}, show() {}, hide() {}, dispose() {},
  trace: (s) => out.output.push(`[trace] ${s}`), debug: (s) => out.output.push(`[debug] ${s}`), info: (s) => out.output.push(`[info] ${s}`),
  warn: (s) => out.output.push(`[warn] ${s}`), error: (s) => out.output.push(`[error] ${s}`),
};
const statusBarItem = {
  _text: "", get text() { return this._text; }, set text(t) { this._text = t; out.statusBar.push(t); },
  tooltip: "", command: undefined, name: "", show() {}, hide() {}, dispose() {},
};

const vscode = {
  version: "1.95.0",
  Disposable, EventEmitter, Uri, Position, Range, InlineCompletionItem, InlineCompletionList, CancellationTokenSource, CancellationError,
  InlineCompletionTriggerKind: { Invoke: 0, Automatic: 1 },
  StatusBarAlignment: { Left: 1, Right: 2 }, LogLevel: { Off: 0, Trace: 1, Debug: 2, Info: 3, Warning: 4, Error: 5 },
  ProgressLocation: { SourceControl: 1, Window: 10, Notification: 15 },
  env: { appName: "fake VS Code", language: "en", machineId: "test", sessionId: "test", uriScheme: "vscode", openExternal: async () => true },
  commands: {
    registerCommand(id, fn) {
      if (commands.has(id)) throw new Error(`command '${id}' already exists`);
      commands.set(id, fn); out.registered.push(id);
      return new Disposable(() => commands.delete(id));
    },
    async executeCommand(id, ...args) {
      if (!commands.has(id)) { if (id.startsWith("workbench.")) return; throw new Error(`command '${id}' not found`); }
      return commands.get(id)(...args);
    },
  },
  workspace: {
    getConfiguration: configuration, textDocuments: [document], notebookDocuments: [],
    workspaceFolders: [{ uri: Uri.file(path.dirname(process.env.MEMOSIGHT_FILE)), name: "project", index: 0 }],
    onDidChangeConfiguration: noEvent, onDidOpenTextDocument: noEvent, onDidCloseTextDocument: noEvent, onDidChangeTextDocument: noEvent,
    onDidSaveTextDocument: noEvent, onWillSaveTextDocument: noEvent, onDidChangeWorkspaceFolders: noEvent,
    isTrusted: true, onDidGrantWorkspaceTrust: noEvent,
    onDidOpenNotebookDocument: noEvent, onDidChangeNotebookDocument: noEvent, onDidCloseNotebookDocument: noEvent, onDidSaveNotebookDocument: noEvent,
    createFileSystemWatcher: () => ({ onDidCreate: noEvent, onDidChange: noEvent, onDidDelete: noEvent, dispose() {} }),
    applyEdit: async () => true,
  },
  window: {
    createOutputChannel: () => outputChannel,
    createStatusBarItem: () => statusBarItem,
    showErrorMessage: async (m) => { out.errors.push(m); },
    showWarningMessage: async (m) => { out.errors.push(m); },
    showInformationMessage: async (m) => { out.output.push(`[message] ${m}`); },
    withProgress: async (_o, task) => task({ report() {} }, new CancellationTokenSource().token),
    showTextDocument: async () => undefined,
    onDidChangeVisibleTextEditors: noEvent, onDidChangeActiveTextEditor: noEvent, visibleTextEditors: [], activeTextEditor: undefined,
    tabGroups: { all: [], onDidChangeTabs: noEvent, onDidChangeTabGroups: noEvent },
  },
  languages: {
    match(selector, doc) {
      const list = Array.isArray(selector) ? selector : [selector];
      return list.some((s) => (typeof s === "string" ? s === doc.languageId : (!s.language || s.language === doc.languageId) && (!s.scheme || s.scheme === doc.uri.scheme))) ? 10 : 0;
    },
    createDiagnosticCollection: () => ({ set() {}, delete() {}, clear() {}, dispose() {}, forEach() {} }),
  },
};
const languagesProxy = new Proxy(vscode.languages, {
  get(target, name) {
    if (name in target) return target[name];
    if (typeof name === "string" && name.startsWith("register")) {
      return (selector, provider) => { providers[name] = provider; note(`${name}`); return new Disposable(() => delete providers[name]); };
    }
    return undefined;
  },
});
// Everything else vscode-languageclient names (classes it subclasses or builds, enums it maps) gets a
// stand-in: a class whose unknown static members are their own names, e.g. CodeActionKind.Empty.
const standIns = new Map();
function standIn(name) {
  if (!standIns.has(name)) {
    const cls = class extends Generic {};
    standIns.set(name, new Proxy(cls, { get: (t, p, r) => (p in t ? Reflect.get(t, p, r) : typeof p === "string" ? `${name}.${p}` : undefined) }));
  }
  return standIns.get(name);
}
const fake = new Proxy({ ...vscode, languages: languagesProxy, __esModule: true }, {
  get: (t, name) => (name in t ? t[name] : typeof name === "string" && /^[A-Z]/.test(name) ? standIn(name) : undefined),
});

const resolve = Module._resolveFilename;
Module._resolveFilename = function (request, ...rest) { return request === "vscode" ? "vscode" : resolve.call(this, request, ...rest); };
require.cache.vscode = { id: "vscode", filename: "vscode", loaded: true, exports: fake };

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function until(what, predicate, timeoutMs = 60000) {
  const deadline = Date.now() + timeoutMs;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
  note(what);
}
const tokenSource = () => new CancellationTokenSource();

async function main() {
  const extension = require(path.join(EXT, "out", "extension.js"));
  const context = { subscriptions: [], extensionPath: EXT, extensionUri: Uri.file(EXT) };
  await extension.activate(context);
  note("activated");
  await until("the model is ready", () => /sparkle/.test(statusBarItem.text));
  out.readyText = statusBarItem.text;

  const completion = await providers.registerCompletionItemProvider?.provideCompletionItems(document, new Position(2, 11), { triggerKind: 0 }, tokenSource().token);
  out.completionFallback = completion === undefined ? null : completion;

  const result = await providers.registerInlineCompletionItemProvider.provideInlineCompletionItems(
    document, new Position(2, 11), { triggerKind: 1, selectedCompletionInfo: undefined }, tokenSource().token);
  const items = Array.isArray(result) ? result : result.items;
  out.items = items.map((i) => ({ insertText: i.insertText, range: i.range, command: i.command }));
  note("inline completion");

  const item = items[0];
  await vscode.commands.executeCommand(item.command.command, ...(item.command.arguments || []));  // what VS Code does on accept
  await until("the status bar counts the acceptance", () => /accepted/.test(statusBarItem.text), 10000);
  out.acceptedText = statusBarItem.text;

  await vscode.commands.executeCommand("memosight.showStatus");
  out.report = out.output.filter((l) => l.startsWith("MemoSight status")).pop() || null;

  await vscode.commands.executeCommand("memosight.restart");
  await until("the restarted server is ready", () => /sparkle/.test(statusBarItem.text));
  out.restartedText = statusBarItem.text;

  await extension.deactivate();
  out.stoppedText = statusBarItem.text;
}

main().then(
  () => { fs.writeFileSync(RESULT, JSON.stringify(out)); process.exit(0); },
  (err) => { out.error = String(err && err.stack || err); fs.writeFileSync(RESULT, JSON.stringify(out)); process.exit(1); },
);
"""


def run_npm(*args: str, timeout: float) -> str:
    env = {**os.environ, "npm_config_update_notifier": "false", "npm_config_fund": "false",
           "npm_config_audit": "false"}
    done = subprocess.run(["npm", *args], cwd=EXTENSION_DIR, env=env, capture_output=True, text=True,
                          timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"npm {' '.join(args)} failed ({done.returncode}):\n{output[-4000:]}"
    return output


@pytest.fixture(scope="module")
def built_extension() -> Path:
    """node_modules from package-lock.json only, and out/ compiled by tsc."""
    if shutil.which("npm") is None:
        pytest.skip("npm is not on PATH: the VS Code extension needs Node.js 20+ and npm to build")
    run_npm("ci", timeout=300)
    run_npm("run", "compile", timeout=180)
    assert (EXTENSION_DIR / "out" / "extension.js").is_file()
    return EXTENSION_DIR


@pytest.mark.npm
def test_unit_tests_pass(built_extension):
    output = run_npm("test", timeout=120)
    assert "# fail 0" in output, output[-4000:]


@pytest.mark.npm
def test_packages_into_a_vsix(built_extension, tmp_path):
    vsix = tmp_path / "memosight.vsix"
    run_npm("exec", "--no", "--", "vsce", "package", "--allow-missing-repository", "--out", str(vsix), timeout=180)
    assert vsix.is_file() and vsix.stat().st_size > 10_000
    names = zipfile.ZipFile(vsix).namelist()
    assert "extension/out/extension.js" in names
    assert "extension/node_modules/vscode-languageclient/package.json" in names
    assert not [n for n in names if n.startswith(("extension/src/", "extension/out/test/"))]


def test_contributed_settings_are_the_server_settings_with_its_defaults():
    properties = MANIFEST["contributes"]["configuration"]["properties"]
    defaults = {key.removeprefix("memosight."): prop["default"] for key, prop in properties.items()}
    server_defaults = {k: v for k, v in defaults.items() if k not in CLIENT_ONLY_SETTINGS}

    # The extension sends camelCase keys; the server must accept every one and its default as is.
    values, errors = validate(server_defaults, "package.json")
    assert errors == []
    # trusted_workspace is no setting: the extension sends VS Code's workspace trust itself
    assert set(values) == set(VALIDATORS) - {"trusted_workspace"}
    assert Settings.of(**values) == Settings()  # the engine's keys included, grouped in its EngineSpec


@pytest.mark.npm
def test_extension_completes_counts_acceptance_and_restarts_with_the_real_server(built_extension, tmp_path,
                                                                                  repeater_model_dir):
    source = tmp_path / "project" / "greet.py"
    source.parent.mkdir()
    source.write_text(SOURCE)
    driver = tmp_path / "driver.js"
    driver.write_text(DRIVER_JS)
    result = tmp_path / "result.json"
    user_settings = {"memosight.pythonPath": sys.executable, "memosight.model": str(repeater_model_dir),
                     "memosight.maxNewTokens": MAX_NEW_TOKENS, "memosight.logLevel": "debug",
                     "memosight.tokenHealing": False}  # the repeater writes "x": no rewriting of the word first
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               MEMOSIGHT_EXTENSION_DIR=str(built_extension), MEMOSIGHT_FILE=str(source),
               MEMOSIGHT_RESULT=str(result), MEMOSIGHT_SETTINGS=json.dumps(user_settings))
    started = time.monotonic()
    proc = subprocess.run(["node", str(driver)], env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=180)
    assert result.exists(), f"the driver wrote no result (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    out = json.loads(result.read_text())
    log = "\n".join(out["output"])[-6000:]
    assert "error" not in out, f"{out['error']}\nevents: {out['events']}\noutput channel:\n{log}"

    suggestion = "x" * MAX_NEW_TOKENS  # the repeater model emits "x" until maxNewTokens
    at = {"line": 2, "character": len("    return ")}
    assert out["items"] == [{"insertText": suggestion, "range": {"start": at, "end": at},
                             "command": {"title": "Accept", "command": "memosight.accepted",
                                         "arguments": [len(suggestion)]}}]
    assert out["completionFallback"] is None  # the completion-item fallback is not asked in VS Code
    # vscode-languageclient registers the server's command once per client (the stand-in throws on a
    # second registration of an id), and the restart disposed of the first one.
    assert out["registered"] == ["memosight.showStatus", "memosight.restart", "memosight.accepted",
                                 "memosight.accepted"]
    assert out["errors"] == [], out["errors"]  # no launch error, no invalid-setting warning from the server
    model = repeater_model_dir.name  # the status bar shows a model folder's last part
    # what runs it (dtype "auto" is measured on this CPU: float32 or int8), and where
    ready = re.fullmatch(rf"\$\(sparkle\) {re.escape(model)} · torch (float32|int8|bfloat16) · cpu", out["readyText"])
    assert ready, out["readyText"]
    assert out["acceptedText"].startswith(f"{out['readyText']} · ")
    assert out["acceptedText"].endswith(" ms · 100% accepted")
    assert "requests:   1 (1 completed, 1 accepted, 0 cancelled, 0 superseded)" in out["report"]
    assert f"command:    {sys.executable} -m memosight.server --stdio --log-level debug" in out["report"]
    assert any(" INFO memosight.engine.loading.torch_load: loaded" in line for line in out["output"]), log
    assert out["restartedText"] == out["readyText"]
    assert out["stoppedText"] == "$(circle-slash) MemoSight: stopped"
    print(f"VS Code extension end to end: {time.monotonic() - started:.1f} s; {out['events']}")
