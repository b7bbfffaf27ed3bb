import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { CLIENT_SETTING_KEYS, explicitValue, InspectedSetting, SERVER_SETTING_KEYS, serverSettings } from "../settings";

// out/test/ -> the extension folder
const manifest = JSON.parse(readFileSync(join(__dirname, "..", "..", "package.json"), "utf8"));
const contributed: Record<string, { default?: unknown }> = manifest.contributes.configuration.properties;

function inspector(values: Record<string, InspectedSetting>) {
  return (key: string) => values[key];
}

test("only the settings the user set are sent, under their camelCase names", () => {
  const settings = serverSettings(
    inspector({
      maxNewTokens: { defaultValue: 64, globalValue: 32 },
      device: { defaultValue: "auto", workspaceValue: "cpu" },
      speculative: { defaultValue: true }, // left at the default: not sent, so .memosight.toml applies
      serverPath: { defaultValue: "memosight-lsp", globalValue: "/opt/bin/memosight-lsp" },
    }),
  );
  assert.deepEqual(settings, { maxNewTokens: 32, device: "cpu" });
});

test("nothing set sends an empty object", () => {
  assert.deepEqual(serverSettings(() => undefined), {});
});

test("the workspace's trust is sent with the settings, trusted or not", () => {
  assert.deepEqual(serverSettings(() => undefined, false), { trustedWorkspace: false });
  const backend = { kind: "openai", url: "http://gpu:8000/v1" };
  assert.deepEqual(serverSettings(inspector({ backend: { defaultValue: null, globalValue: backend } }), true), {
    trustedWorkspace: true,
    backend,
  });
});

test("the most specific scope wins: folder over workspace over user", () => {
  assert.equal(explicitValue({ globalValue: 1, workspaceValue: 2, workspaceFolderValue: 3 }), 3);
  assert.equal(explicitValue({ globalValue: 1, workspaceValue: 2 }), 2);
  assert.equal(explicitValue({ globalValue: 1 }), 1);
  assert.equal(explicitValue({ defaultValue: 1 }), undefined);
  assert.equal(explicitValue({ globalValue: "/models/big", workspaceValue: null }), null);
});

test("falsy values the user set are still sent", () => {
  const settings = serverSettings(
    inspector({
      speculative: { defaultValue: true, globalValue: false },
      suffixShare: { defaultValue: 0.25, globalValue: 0 },
      languages: { defaultValue: [], workspaceValue: [] },
      model: { defaultValue: null, workspaceValue: null },
    }),
  );
  assert.deepEqual(settings, { speculative: false, suffixShare: 0, languages: [], model: null });
});

test("every server key and client key is contributed in package.json, and nothing else", () => {
  const expected = [...SERVER_SETTING_KEYS, ...CLIENT_SETTING_KEYS].map((k) => `memosight.${k}`).sort();
  assert.deepEqual(Object.keys(contributed).sort(), expected);
});

test("contributed defaults are the server's defaults", () => {
  const defaults = Object.fromEntries(SERVER_SETTING_KEYS.map((k) => [k, contributed[`memosight.${k}`].default]));
  assert.deepEqual(defaults, {
    model: null,
    draftModel: null,
    device: "auto",
    dtype: "auto",
    runtime: "auto",
    maxNewTokens: 64,
    multiline: "auto",
    contextBudget: 1024,
    suffixShare: 0.25,
    suffixTokens: 256,
    languages: [],
    speculative: true,
    tokenHealing: true,
    prefillOnEdit: true,
    exactPrompt: false,
    prefetch: true,
    kvCacheMb: 256,
    latencyBudgetMs: 100,
    minConfidence: 0,
    logLevel: "info",
    backend: { kind: "local" },
  });
});

test("the manifest activates on, and the extension serves, the same languages", () => {
  const source = readFileSync(join(__dirname, "..", "..", "src", "extension.ts"), "utf8");
  const languages = JSON.parse(/const LANGUAGES = (\[[^\]]*\])/.exec(source)![1]);
  assert.deepEqual(manifest.activationEvents, languages.map((l: string) => `onLanguage:${l}`));
});
