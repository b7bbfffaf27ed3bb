import assert from "node:assert/strict";
import { test } from "node:test";

import { serverLogLevel } from "../serverLog";

test("a server log line keeps its own level", () => {
  const at = "2026-11-30 03:23:38,723";
  assert.equal(serverLogLevel(`${at} INFO memosight.engine.loading.torch_load: loaded default on cpu`, "error"), "info");
  assert.equal(serverLogLevel(`${at} DEBUG memosight.server.suggest: request 3`, "error"), "info");
  assert.equal(serverLogLevel(`${at} WARNING memosight.server.lsp: invalid setting`, "info"), "warn");
  assert.equal(serverLogLevel(`${at} ERROR memosight.server.suggest: generation failed`, "info"), "error");
  assert.equal(serverLogLevel(`${at} CRITICAL root: out of memory`, "info"), "error");
});

test("a traceback continues the record before it; anything else before the first record is an error", () => {
  let level = serverLogLevel("2026-11-30 03:23:38,723 ERROR memosight.server.suggest: generation failed", "error");
  for (const line of ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>', "ValueError: bad"]) {
    level = serverLogLevel(line, level);
    assert.equal(level, "error");
  }
  assert.equal(serverLogLevel("  continued", "warn"), "warn");
  assert.equal(serverLogLevel("ModuleNotFoundError: No module named 'memosight'", "error"), "error");
});
