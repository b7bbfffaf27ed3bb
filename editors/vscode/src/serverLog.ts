// Which output channel level each line of the server's stderr gets. No 'vscode' import.
//
// vscode-languageclient logs every stderr line as an error; the server's log lines carry their own
// level ("2026-11-30 03:23:38,723 INFO memosight.engine.loading.torch_load: loaded ..."), so use it. DEBUG goes
// out as info: the server already filters by memosight.logLevel, and the channel hides debug lines
// unless its own level is lowered too.

export type LogMethod = "info" | "warn" | "error";

const RECORD = /^\d{4}-\d{2}-\d{2}[ T][\d:,.]+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) /;

/** The level of `line`; a line without one (a traceback's) continues the record before it. */
export function serverLogLevel(line: string, previous: LogMethod): LogMethod {
  const match = RECORD.exec(line);
  if (!match) {
    return previous;
  }
  switch (match[1]) {
    case "WARNING":
      return "warn";
    case "ERROR":
    case "CRITICAL":
      return "error";
    default:
      return "info";
  }
}
