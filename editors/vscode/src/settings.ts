// Editor settings -> the server's settings. No 'vscode' import, so node's test runner can load it.
//
// Only the values the user has set are sent. Sending VS Code's defaults would override the
// project's .memosight.toml with them, while the server's rule is: file first, editor settings on top.

/** The `memosight.*` keys the server understands, in camelCase (the server converts to snake_case). */
export const SERVER_SETTING_KEYS = [
  "model",
  "draftModel",
  "device",
  "dtype",
  "runtime",
  "maxNewTokens",
  "multiline",
  "contextBudget",
  "suffixShare",
  "suffixTokens",
  "languages",
  "speculative",
  "tokenHealing",
  "prefillOnEdit",
  "exactPrompt",
  "prefetch",
  "kvCacheMb",
  "latencyBudgetMs",
  "minConfidence",
  "logLevel",
  "backend",
] as const;

/** Keys that say how the server is launched: a change restarts it. */
export const LAUNCH_SETTING_KEYS = ["serverPath", "pythonPath"] as const;

/** Keys read by the extension (and vscode-languageclient) itself; never sent, the server would call them unknown. */
export const CLIENT_SETTING_KEYS = [...LAUNCH_SETTING_KEYS, "trace.server"] as const;

export type ServerSettings = Partial<Record<(typeof SERVER_SETTING_KEYS)[number] | "trustedWorkspace", unknown>>;

/** The shape of vscode.WorkspaceConfiguration.inspect(key), the parts we read. */
export interface InspectedSetting {
  defaultValue?: unknown;
  globalValue?: unknown;
  workspaceValue?: unknown;
  workspaceFolderValue?: unknown;
}

/** The value the user set for one key, most specific scope first; undefined when only the default applies. */
export function explicitValue(inspected: InspectedSetting | undefined): unknown {
  if (!inspected) {
    return undefined;
  }
  // Not `??`: null is a value the user can set (model: null = back to the embedded model).
  for (const value of [inspected.workspaceFolderValue, inspected.workspaceValue, inspected.globalValue]) {
    if (value !== undefined) {
      return value;
    }
  }
  return undefined;
}

/**
 * The settings to send as initializationOptions and as the `memosight` section of
 * workspace/configuration: every server key the user has set, under its camelCase name, and
 * whether the user trusts the workspace (VS Code's workspace trust): only then may the project's
 * own config file send code to a server (its `backend`).
 */
export function serverSettings(
  inspect: (key: string) => InspectedSetting | undefined,
  trusted?: boolean,
): ServerSettings {
  const settings: ServerSettings = trusted === undefined ? {} : { trustedWorkspace: trusted };
  for (const key of SERVER_SETTING_KEYS) {
    const value = explicitValue(inspect(key));
    if (value !== undefined) {
      settings[key] = value;
    }
  }
  return settings;
}
