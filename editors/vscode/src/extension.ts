// The VS Code side of MemoSight: starts `memosight-lsp --stdio` with vscode-languageclient, which
// registers the inline completion provider (LSP 3.18 textDocument/inlineCompletion) and, from the
// server's executeCommandProvider, the `memosight.accepted` command that each suggestion runs when
// it is accepted. This file adds the settings plumbing, the status bar and two commands.

import * as os from "node:os";
import * as readline from "node:readline";
import { Readable } from "node:stream";
import * as vscode from "vscode";
import {
  DidChangeConfigurationNotification,
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  State,
  TransportKind,
} from "vscode-languageclient/node";

import { LogMethod, serverLogLevel } from "./serverLog";
import { describeCommand, launchFailureMessage, resolveServerCommand, ServerCommand } from "./serverCommand";
import { LAUNCH_SETTING_KEYS, serverSettings, ServerSettings } from "./settings";
import { VISITED_METHOD, visitedParams } from "./visits";
import { formatClientState, formatStatusBar, formatStatusReport, ServerStatus, STATUS_REQUEST, StatusBarView } from "./status";

const SECTION = "memosight";
const LANGUAGES = ["python", "javascript", "javascriptreact", "typescript", "typescriptreact", "go", "rust"];
// Registered by vscode-languageclient's ExecuteCommandFeature; registering it here too would throw.
const ACCEPTED_COMMAND = "memosight.accepted";
const SHOW_STATUS_COMMAND = "memosight.showStatus";
const RESTART_COMMAND = "memosight.restart";
const POLL_MS = 5000;
const POLL_WHILE_LOADING_MS = 1000;
const REFRESH_AFTER_COMPLETION_MS = 300;

/** Forwards a stream of the server process to the output channel line by line, each at its own level. */
function forwardLines(input: Readable, output: vscode.LogOutputChannel, initial: LogMethod): void {
  let level = initial;
  readline.createInterface({ input, crlfDelay: Infinity, terminal: false, historySize: 0 }).on("line", (line) => {
    level = serverLogLevel(line, level);
    output[level](line);
  });
}

/**
 * The server's items carry no range: their text goes in at the cursor. VS Code's default for an item
 * without one is the word at the cursor up to the end of the line, which would hide a suggestion typed
 * mid-word (its text does not start with the word) and replace the rest of the line; so give each an
 * empty range at the cursor.
 */
function insertAtCursor(
  result: vscode.InlineCompletionItem[] | vscode.InlineCompletionList | null | undefined,
  position: vscode.Position,
): vscode.InlineCompletionItem[] | vscode.InlineCompletionList | null | undefined {
  const items = Array.isArray(result) ? result : result?.items;
  for (const item of items ?? []) {
    item.range ??= new vscode.Range(position, position);
  }
  return result;
}

function configuration(): vscode.WorkspaceConfiguration {
  return vscode.workspace.getConfiguration(SECTION);
}

function currentServerSettings(): ServerSettings {
  const config = configuration();
  return serverSettings((key) => config.inspect(key), vscode.workspace.isTrusted);
}

function currentServerCommand(): ServerCommand {
  const config = configuration();
  return resolveServerCommand(
    {
      serverPath: config.get<string | null>("serverPath"),
      pythonPath: config.get<string | null>("pythonPath"),
      logLevel: config.get<string | null>("logLevel"),
    },
    { homeDir: os.homedir(), workspaceFolder: vscode.workspace.workspaceFolders?.[0]?.uri.fsPath },
  );
}

class MemoSight implements vscode.Disposable {
  private client: LanguageClient | undefined;
  private command: ServerCommand | undefined;
  private launchError: string | undefined;
  private lastStatus: ServerStatus | undefined;
  private pollTimer: NodeJS.Timeout | undefined;
  private refreshTimer: NodeJS.Timeout | undefined;
  private statusInFlight = false;

  constructor(
    private readonly output: vscode.LogOutputChannel,
    private readonly statusBar: vscode.StatusBarItem,
  ) {
    statusBar.command = SHOW_STATUS_COMMAND;
    statusBar.name = "MemoSight";
    this.render(formatClientState("stopped"));
    statusBar.show();
  }

  async start(): Promise<void> {
    this.command = currentServerCommand();
    this.launchError = undefined;
    this.lastStatus = undefined;
    this.render(formatClientState("starting"));
    this.output.info(`Starting ${describeCommand(this.command)}`);
    const client = new LanguageClient(SECTION, "MemoSight", this.serverOptions(this.command), this.clientOptions());
    this.client = client;
    client.onDidChangeState((event) => {
      if (event.newState === State.Stopped && this.client === client) {
        this.lastStatus = undefined;
        this.render(formatClientState("stopped"));
      }
    });
    try {
      await client.start();
    } catch (error) {
      this.launchError = launchFailureMessage(this.command, error);
      this.output.error(this.launchError);
      this.render(formatClientState("failed", this.launchError));
      void vscode.window.showErrorMessage(this.launchError, "Open Settings", "Show Log").then((choice) => {
        if (choice === "Open Settings") {
          void vscode.commands.executeCommand("workbench.action.openSettings", SECTION);
        } else if (choice === "Show Log") {
          this.output.show(true);
        }
      });
      return;
    }
    this.schedulePoll(0);
    this.visited(vscode.window.activeTextEditor, true); // the file on screen at start: warm before the first key
  }

  async stop(): Promise<void> {
    clearTimeout(this.pollTimer);
    clearTimeout(this.refreshTimer);
    const client = this.client;
    this.client = undefined;
    if (client) {
      try {
        await client.dispose();
      } catch (error) {
        // A client that never started (launch failure) has nothing to stop.
        this.output.debug(`Stopping the client: ${error instanceof Error ? error.message : String(error)}`);
      }
    }
    this.render(formatClientState("stopped"));
  }

  async restart(): Promise<void> {
    await this.stop();
    await this.start();
  }

  /** The user left `editor` (another one became active): where they were is recent code. Or, with
   * `entered`, they are now in it: the server prefills the prompt at their line. */
  visited(editor: vscode.TextEditor | undefined, entered = false): void {
    const document = editor?.document;
    const params = visitedParams(document?.uri.toString(), document?.uri.scheme, document?.languageId,
      editor?.selection.active.line, LANGUAGES, entered);
    if (params && this.client?.isRunning()) {
      this.client.sendNotification(VISITED_METHOD, params).catch((error) => {
        this.output.debug(`memosight/visited: ${error instanceof Error ? error.message : String(error)}`);
      });
    }
  }

  /** Send the settings again (the workspace became trusted: they say so now). */
  async settingsChanged(): Promise<void> {
    await this.client?.sendNotification(DidChangeConfigurationNotification.type, {
      settings: { [SECTION]: currentServerSettings() },
    });
  }

  async showStatus(): Promise<void> {
    const status = await this.refreshStatus();
    const command = this.command ? describeCommand(this.command) : undefined;
    if (status) {
      this.output.appendLine(formatStatusReport(status, command));
    } else if (this.launchError) {
      this.output.appendLine(this.launchError);
    } else {
      this.output.appendLine(`MemoSight: the server is not running${command ? ` (command: ${command})` : ""}.`);
    }
    this.output.show(true);
  }

  /** Asks the server for its status and shows it in the status bar; undefined when it cannot answer. */
  async refreshStatus(): Promise<ServerStatus | undefined> {
    const client = this.client;
    if (!client || !client.isRunning() || this.statusInFlight) {
      return client?.isRunning() ? this.lastStatus : undefined;
    }
    this.statusInFlight = true;
    try {
      const status = await client.sendRequest<ServerStatus>(STATUS_REQUEST, {});
      if (client === this.client) {
        this.lastStatus = status;
        this.render(formatStatusBar(status));
      }
      return status;
    } catch (error) {
      this.output.warn(`${STATUS_REQUEST} failed: ${error instanceof Error ? error.message : String(error)}`);
      return undefined;
    } finally {
      this.statusInFlight = false;
    }
  }

  /** A refresh shortly after a completion or an acceptance, merged when they come in bursts. */
  scheduleRefresh(): void {
    clearTimeout(this.refreshTimer);
    this.refreshTimer = setTimeout(() => void this.refreshStatus(), REFRESH_AFTER_COMPLETION_MS);
  }

  dispose(): void {
    void this.stop();
  }

  private schedulePoll(delayMs: number): void {
    clearTimeout(this.pollTimer);
    this.pollTimer = setTimeout(async () => {
      await this.refreshStatus();
      if (this.client) {
        this.schedulePoll(this.lastStatus?.state === "loading" ? POLL_WHILE_LOADING_MS : POLL_MS);
      }
    }, delayMs);
  }

  private render(view: StatusBarView): void {
    this.statusBar.text = view.text;
    this.statusBar.tooltip = view.tooltip;
  }

  private serverOptions(command: ServerCommand): ServerOptions {
    return { command: command.command, args: command.args, transport: TransportKind.stdio };
  }

  private clientOptions(): LanguageClientOptions {
    return {
      documentSelector: LANGUAGES.map((language) => ({ scheme: "file", language })),
      outputChannel: this.output,
      traceOutputChannel: this.output,
      initializationOptions: () => currentServerSettings(),
      synchronize: { configurationSection: SECTION },
      stdioOptions: {
        stdout: (input, output) => forwardLines(input, output, "info"), // only used by non-stdio transports
        stderr: (input, output) => forwardLines(input, output, "error"),
      },
      middleware: {
        workspace: {
          // The server pulls section "memosight"; answer with the settings the user set, not VS Code's
          // defaults, so that the project's .memosight.toml still applies to the keys left unset.
          configuration: async (params, token, next) => {
            const answer = await next(params, token);
            if (!Array.isArray(answer)) {
              return answer;
            }
            return params.items.map((item, i) => (item.section === SECTION ? currentServerSettings() : answer[i]));
          },
          didChangeConfiguration: async () => {
            await this.client?.sendNotification(DidChangeConfigurationNotification.type, {
              settings: { [SECTION]: currentServerSettings() },
            });
          },
        },
        // The server also offers its suggestion as a textDocument/completion item for clients without
        // inline completion. VS Code has it, and the two requests would supersede each other.
        provideCompletionItem: () => undefined,
        provideInlineCompletionItems: async (document, position, context, token, next) => {
          const result = await next(document, position, context, token);
          this.scheduleRefresh();
          return insertAtCursor(result, position);
        },
        executeCommand: async (command, args, next) => {
          const result = await next(command, args);
          if (command === ACCEPTED_COMMAND) {
            this.scheduleRefresh();
          }
          return result;
        },
      },
    };
  }
}

let memosight: MemoSight | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  const output = vscode.window.createOutputChannel("MemoSight", { log: true });
  const statusBar = vscode.window.createStatusBarItem("memosight.status", vscode.StatusBarAlignment.Right, 100);
  memosight = new MemoSight(output, statusBar);
  const instance = memosight;
  let active = vscode.window.activeTextEditor; // the editor the user is in, to tell the server when they leave it
  context.subscriptions.push(
    output,
    statusBar,
    instance,
    vscode.commands.registerCommand(SHOW_STATUS_COMMAND, () => instance.showStatus()),
    vscode.commands.registerCommand(RESTART_COMMAND, () => instance.restart()),
    // Trust granted: the project's own backend setting may now apply; the server re-reads the settings.
    vscode.workspace.onDidGrantWorkspaceTrust(() => void instance.settingsChanged()),
    vscode.window.onDidChangeActiveTextEditor((editor) => {
      instance.visited(active);
      instance.visited(editor, true);
      active = editor;
    }),
    vscode.workspace.onDidChangeConfiguration((event) => {
      if (LAUNCH_SETTING_KEYS.some((key) => event.affectsConfiguration(`${SECTION}.${key}`))) {
        output.info("The server launch settings changed; restarting.");
        void instance.restart();
      }
    }),
  );
  await instance.start();
}

export async function deactivate(): Promise<void> {
  await memosight?.stop();
  memosight = undefined;
}
