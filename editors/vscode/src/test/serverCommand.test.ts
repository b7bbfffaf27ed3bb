import assert from "node:assert/strict";
import { test } from "node:test";

import { describeCommand, launchFailureMessage, resolveServerCommand } from "../serverCommand";

const context = { homeDir: "/home/ada", workspaceFolder: "/work/project" };

test("by default memosight-lsp is looked up on PATH", () => {
  assert.deepEqual(resolveServerCommand({}, context), { command: "memosight-lsp", args: ["--stdio"] });
  assert.deepEqual(resolveServerCommand({ serverPath: "", pythonPath: null }, context), {
    command: "memosight-lsp",
    args: ["--stdio"],
  });
});

test("serverPath names the executable; ~ and ${workspaceFolder} are expanded", () => {
  assert.deepEqual(resolveServerCommand({ serverPath: "~/.local/bin/memosight-lsp" }, context), {
    command: "/home/ada/.local/bin/memosight-lsp",
    args: ["--stdio"],
  });
  assert.equal(
    resolveServerCommand({ serverPath: "${workspaceFolder}/.venv/bin/memosight-lsp" }, context).command,
    "/work/project/.venv/bin/memosight-lsp",
  );
});

test("pythonPath runs the server as a module and wins over serverPath", () => {
  assert.deepEqual(
    resolveServerCommand({ serverPath: "/opt/memosight-lsp", pythonPath: " ${workspaceFolder}/.venv/bin/python " }, context),
    { command: "/work/project/.venv/bin/python", args: ["-m", "memosight.server", "--stdio"] },
  );
});

test("a valid logLevel is passed on the command line, an invalid one is left to the server to report", () => {
  assert.deepEqual(resolveServerCommand({ logLevel: "debug" }, context).args, ["--stdio", "--log-level", "debug"]);
  assert.deepEqual(resolveServerCommand({ logLevel: "loud" }, context).args, ["--stdio"]);
});

test("${workspaceFolder} without a folder open is left as is", () => {
  assert.equal(
    resolveServerCommand({ pythonPath: "${workspaceFolder}/py" }, { homeDir: "/h" }).command,
    "${workspaceFolder}/py",
  );
});

test("the command line is quoted where it has spaces", () => {
  assert.equal(describeCommand({ command: "/My Tools/python", args: ["-m", "memosight.server"] }), '"/My Tools/python" -m memosight.server');
});

test("a missing executable gets install and settings advice", () => {
  const command = resolveServerCommand({}, context);
  const message = launchFailureMessage(command, new Error("spawn memosight-lsp ENOENT"));
  assert.match(message, /memosight-lsp was not found/);
  assert.match(message, /pip install memosight/);
  assert.match(message, /memosight\.serverPath/);
  assert.match(message, /memosight\.pythonPath/);
});

test("other launch failures name the command and the reason", () => {
  const message = launchFailureMessage({ command: "python", args: ["-m", "memosight.server", "--stdio"] }, "exit code 1");
  assert.match(message, /`python -m memosight.server --stdio`: exit code 1/);
  assert.match(message, /output channel/);
});
