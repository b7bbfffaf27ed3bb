import assert from "node:assert/strict";
import { test } from "node:test";

import {
  formatClientState,
  formatLatency,
  formatRate,
  formatStatusBar,
  formatStatusReport,
  formatSummary,
  ServerStatus,
  shortModelName,
} from "../status";

// The example response of memosight/status.
const ready: ServerStatus = {
  state: "ready",
  model: "default",
  device: "cpu",
  dtype: "float32",
  runtime: "torch",
  error: null,
  requests: {
    requests: 12,
    completed: 10,
    accepted: 3,
    cancelled: 1,
    superseded: 2,
    latency_ms: { last: 41.2, p50: 38.0, p95: 90.1 },
    acceptance_rate: 0.3,
  },
  cache: { hit_rate: 0.93 },
  speculative: { mean_accepted: 2.4 },
};

test("a ready server shows model, runtime, dtype, device, last latency and acceptance", () => {
  assert.equal(formatStatusBar(ready).text, "$(sparkle) default · torch float32 · cpu · 41 ms · 30% accepted");
  const gguf: ServerStatus = { ...ready, model: "qwen2.5-coder-0.5b", runtime: "llamacpp", dtype: "Q4_K_M", requests: {} };
  assert.equal(formatStatusBar(gguf).text, "$(sparkle) qwen2.5-coder-0.5b · llamacpp Q4_K_M · cpu");
});

test("a backend shows its kind, and its fallback to the local model while it is down", () => {
  const remote: ServerStatus = { state: "ready", model: "qwen", device: "remote", dtype: "remote", requests: {},
    backend: { kind: "llamacpp", url: "http://127.0.0.1:8080", state: "ok", fallback_reason: null } };
  assert.equal(formatStatusBar(remote).text, "$(sparkle) qwen · llamacpp backend");
  const down: ServerStatus = { ...remote, backend: { ...remote.backend, state: "unreachable",
    fallback_reason: "connection refused" } };
  assert.equal(formatStatusBar(down).text, "$(sparkle) qwen · llamacpp backend · $(warning) fallback: local model");
  assert.match(formatSummary(down).join("\n"), /unreachable \(fallback to the local model: connection refused\)/);
  const noFallback: ServerStatus = { ...remote, backend: { ...remote.backend, state: "unreachable" } };
  assert.equal(formatStatusBar(noFallback).text, "$(sparkle) qwen · llamacpp backend · $(warning) unreachable");
});

test("before the first completion only model and device are shown", () => {
  const fresh: ServerStatus = { state: "ready", model: "/models/Qwen2.5-Coder-0.5B", device: "cuda:0", requests: {
    requests: 0, completed: 0, latency_ms: { last: null, p50: null, p95: null }, acceptance_rate: null } };
  assert.equal(formatStatusBar(fresh).text, "$(sparkle) Qwen2.5-Coder-0.5B · cuda:0");
});

test("loading and error states", () => {
  assert.equal(formatStatusBar({ state: "loading", model: "Qwen/Qwen2.5-Coder-1.5B" }).text, "$(loading~spin) MemoSight: loading Qwen2.5-Coder-1.5B");
  const failed = formatStatusBar({ state: "error", model: "x", error: "model x is not in the Hugging Face cache" });
  assert.equal(failed.text, "$(error) MemoSight: error");
  assert.match(failed.tooltip, /not in the Hugging Face cache/);
});

test("client states without a server status", () => {
  assert.equal(formatClientState("starting").text, "$(loading~spin) MemoSight: starting");
  assert.equal(formatClientState("stopped").text, "$(circle-slash) MemoSight: stopped");
  assert.equal(formatClientState("failed", "memosight-lsp was not found").tooltip, "memosight-lsp was not found");
});

test("latency, rate and model name formatting", () => {
  assert.equal(formatLatency(41.6), "42 ms");
  assert.equal(formatLatency(1340), "1.3 s");
  assert.equal(formatLatency(null), "—");
  assert.equal(formatRate(0.333), "33%");
  assert.equal(formatRate(undefined), "—");
  assert.equal(shortModelName("C:\\models\\starcoder2-3b\\"), "starcoder2-3b");
  assert.equal(shortModelName(null), "default");
});

test("the tooltip and report carry every counter", () => {
  const summary = formatSummary(ready).join("\n");
  assert.match(summary, /cpu \(float32\)/);
  assert.match(summary, /12 \(10 completed, 3 accepted, 1 cancelled, 2 superseded\)/);
  assert.match(summary, /last 41 ms, p50 38 ms, p95 90 ms/);
  assert.match(summary, /acceptance: 30%/);
  assert.match(summary, /93% hit rate/);
  assert.match(formatStatusBar(ready).tooltip, /Click for the full status/);
});

test("the report ends with the raw response, so fields added later are shown too", () => {
  const report = formatStatusReport({ ...ready, version: "0.1.0" }, "memosight-lsp --stdio");
  assert.match(report, /^MemoSight status \(server 0\.1\.0\)/);
  assert.match(report, /command: +memosight-lsp --stdio/);
  assert.deepEqual(JSON.parse(report.slice(report.indexOf("\n{"))), { ...ready, version: "0.1.0" });
});

test("a sparse response does not throw", () => {
  const status: ServerStatus = { state: "ready" };
  assert.equal(formatStatusBar(status).text, "$(sparkle) default");
  assert.match(formatSummary(status).join("\n"), /requests: +0 \(0 completed/);
});
