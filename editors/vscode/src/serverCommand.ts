// How the server process is launched. No 'vscode' import, so node's test runner can load it.

export const DEFAULT_SERVER_PATH = "memosight-lsp";

export interface LaunchSettings {
  serverPath?: string | null; // the memosight-lsp executable; a bare name is looked up on PATH
  pythonPath?: string | null; // a Python with memosight installed; wins over serverPath when set
  logLevel?: string | null; // passed as --log-level so that the first log lines already use it
}

export interface LaunchContext {
  homeDir: string; // expands a leading ~
  workspaceFolder?: string; // expands ${workspaceFolder}, e.g. "${workspaceFolder}/.venv/bin/python"
}

export interface ServerCommand {
  command: string;
  args: string[];
}

const LOG_LEVELS = new Set(["debug", "info", "warning", "error"]);

/** Expands ~ and ${workspaceFolder}; a path that names an unknown folder is returned as is. */
export function expandPath(path: string, context: LaunchContext): string {
  let out = path.trim();
  if (out === "~" || out.startsWith("~/") || out.startsWith("~\\")) {
    out = context.homeDir + out.slice(1);
  }
  if (context.workspaceFolder !== undefined) {
    out = out.split("${workspaceFolder}").join(context.workspaceFolder);
  }
  return out;
}

/** `<python> -m memosight.server --stdio` when pythonPath is set, else `<serverPath> --stdio`. */
export function resolveServerCommand(settings: LaunchSettings, context: LaunchContext): ServerCommand {
  const args = ["--stdio"];
  if (settings.logLevel && LOG_LEVELS.has(settings.logLevel)) {
    args.push("--log-level", settings.logLevel);
  }
  const python = settings.pythonPath?.trim();
  if (python) {
    return { command: expandPath(python, context), args: ["-m", "memosight.server", ...args] };
  }
  const server = settings.serverPath?.trim() || DEFAULT_SERVER_PATH;
  return { command: expandPath(server, context), args };
}

/** The command line as a user would type it, for logs and error messages. */
export function describeCommand(command: ServerCommand): string {
  const quote = (s: string) => (/[\s"']/.test(s) ? JSON.stringify(s) : s);
  return [command.command, ...command.args].map(quote).join(" ");
}

/** What to tell the user when the server process could not be started. */
export function launchFailureMessage(command: ServerCommand, error: unknown): string {
  const reason = error instanceof Error ? error.message : String(error);
  const line = describeCommand(command);
  if (/ENOENT|not found|no such file/i.test(reason)) {
    return (
      `MemoSight: could not start \`${line}\`: ${command.command} was not found. ` +
      "Install the server (pip install memosight, or pip install -e . in a clone), or set " +
      "memosight.serverPath to the memosight-lsp executable or memosight.pythonPath to a Python that has it."
    );
  }
  return `MemoSight: could not start \`${line}\`: ${reason}. See the MemoSight output channel for the server's log.`;
}
