// The status bar text, tooltip and report from a `memosight/status` response.
// No 'vscode' import, so node's test runner can load it.

export const STATUS_REQUEST = "memosight/status";

export interface LatencyMs {
  last?: number | null;
  p50?: number | null;
  p95?: number | null;
}

export interface RequestCounters {
  requests?: number;
  completed?: number;
  accepted?: number;
  cancelled?: number;
  superseded?: number;
  latency_ms?: LatencyMs;
  acceptance_rate?: number | null;
  [key: string]: unknown;
}

/** The response of `memosight/status`; fields the server adds later are kept and shown in the report. */
export interface ServerStatus {
  state: "ready" | "loading" | "error" | string;
  model?: string | null;
  device?: string | null;
  dtype?: string | null;
  runtime?: string | null;
  backend?: BackendStatus | null;
  error?: string | null;
  version?: string;
  requests?: RequestCounters;
  cache?: Record<string, unknown>;
  speculative?: Record<string, unknown>;
  [key: string]: unknown;
}

/** A serving engine's part of the status ([backend] in the config). */
export interface BackendStatus {
  kind?: string;
  url?: string;
  state?: string; // ok | slow | unreachable | error | unknown
  fallback_reason?: string | null;
  fallback?: Record<string, unknown> | null;
  [key: string]: unknown;
}

/** What the extension knows when it has no status from the server. */
export type ClientState = "starting" | "stopped" | "failed";

export interface StatusBarView {
  text: string;
  tooltip: string;
}

/** "41 ms", "1.3 s"; an em dash when unknown. */
export function formatLatency(ms: number | null | undefined): string {
  if (typeof ms !== "number" || !Number.isFinite(ms)) {
    return "—";
  }
  return ms >= 1000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms)} ms`;
}

/** "30%"; an em dash when no completion has been shown yet. */
export function formatRate(rate: number | null | undefined): string {
  if (typeof rate !== "number" || !Number.isFinite(rate)) {
    return "—";
  }
  return `${Math.round(rate * 100)}%`;
}

/** The last part of a model folder or Hugging Face id: "/models/Qwen2.5-Coder-0.5B" -> "Qwen2.5-Coder-0.5B". */
export function shortModelName(model: string | null | undefined): string {
  if (!model) {
    return "default";
  }
  const parts = model.split(/[\\/]+/).filter((p) => p.length > 0);
  return parts.length > 0 ? parts[parts.length - 1] : model;
}

/** The status bar item for a server that answered `memosight/status`. */
export function formatStatusBar(status: ServerStatus): StatusBarView {
  const model = shortModelName(status.model);
  if (status.state === "loading") {
    return { text: `$(loading~spin) MemoSight: loading ${model}`, tooltip: `Loading ${status.model ?? "the default model"}…` };
  }
  if (status.state === "error") {
    return { text: "$(error) MemoSight: error", tooltip: `MemoSight could not load the model: ${status.error ?? "unknown error"}` };
  }
  const requests = status.requests ?? {};
  const parts = [model, ...engineParts(status)];
  const last = requests.latency_ms?.last;
  if (typeof last === "number") {
    parts.push(formatLatency(last));
  }
  if (typeof requests.acceptance_rate === "number") {
    parts.push(`${formatRate(requests.acceptance_rate)} accepted`);
  }
  return { text: `$(sparkle) ${parts.join(" · ")}`, tooltip: formatSummary(status).join("\n") + "\n\nClick for the full status." };
}

/** What runs the model, as the status bar shows it: "llamacpp Q4_K_M · cpu", "torch bfloat16 · cuda:0",
 * "llamacpp backend"; with "⚠ fallback: local model" while a backend's requests go to the local model. */
export function engineParts(status: ServerStatus): string[] {
  const backend = status.backend;
  if (backend) {
    const parts = [`${backend.kind ?? "remote"} backend`];
    if (backend.state !== "ok" && backend.state !== "unknown" && backend.fallback_reason) {
      parts.push("$(warning) fallback: local model");
    } else if (backend.state === "unreachable" || backend.state === "error") {
      parts.push(`$(warning) ${backend.state}`);
    }
    return parts;
  }
  const parts: string[] = [];
  const engine = [status.runtime, status.dtype].filter((p) => typeof p === "string" && p.length > 0).join(" ");
  if (engine) {
    parts.push(engine);
  }
  if (status.device) {
    parts.push(status.device);
  }
  return parts;
}

/** The status bar item while there is no server status to show. */
export function formatClientState(state: ClientState, detail?: string): StatusBarView {
  switch (state) {
    case "starting":
      return { text: "$(loading~spin) MemoSight: starting", tooltip: "Starting the MemoSight server…" };
    case "stopped":
      return { text: "$(circle-slash) MemoSight: stopped", tooltip: "The MemoSight server is not running. Click for details." };
    case "failed":
      return { text: "$(error) MemoSight: not running", tooltip: detail ?? "The MemoSight server could not be started. Click for details." };
  }
}

/** One line per topic: model, device, requests, latency, acceptance. */
export function formatSummary(status: ServerStatus): string[] {
  const requests = status.requests ?? {};
  const latency = requests.latency_ms ?? {};
  const device = status.device ? `${status.device}${status.dtype ? ` (${status.dtype})` : ""}` : "—";
  const lines = [
    `state:      ${status.state}${status.error ? ` — ${status.error}` : ""}`,
    `model:      ${status.model ?? "default"}`,
    `device:     ${device}`,
    `runtime:    ${status.runtime ?? "—"}`,
    `requests:   ${requests.requests ?? 0} (${requests.completed ?? 0} completed, ${requests.accepted ?? 0} accepted, ` +
      `${requests.cancelled ?? 0} cancelled, ${requests.superseded ?? 0} superseded)`,
    `latency:    last ${formatLatency(latency.last)}, p50 ${formatLatency(latency.p50)}, p95 ${formatLatency(latency.p95)}`,
    `acceptance: ${formatRate(requests.acceptance_rate)}`,
  ];
  const backend = status.backend;
  if (backend) {
    lines.push(`backend:    ${backend.kind ?? "remote"} at ${backend.url ?? "?"}, ${backend.state ?? "unknown"}` +
      (backend.fallback_reason ? ` (fallback to the local model: ${backend.fallback_reason})` : ""));
  }
  const hitRate = status.cache?.hit_rate;
  if (typeof hitRate === "number") {
    lines.push(`KV cache:   ${formatRate(hitRate)} hit rate`);
  }
  return lines;
}

/** The full status for the output channel: the summary, then every field the server sent. */
export function formatStatusReport(status: ServerStatus, serverCommand?: string): string {
  const header = `MemoSight status${status.version ? ` (server ${status.version})` : ""}`;
  const lines = [header, ...formatSummary(status).map((l) => `  ${l}`)];
  if (serverCommand) {
    lines.push(`  command:    ${serverCommand}`);
  }
  lines.push("", JSON.stringify(status, null, 2));
  return lines.join("\n");
}
