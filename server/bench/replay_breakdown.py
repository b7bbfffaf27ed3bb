"""Where each replayed request's milliseconds went: the server's stages (timeline.py) matched to
the latency this client measured, as figures, a table and a stacked bar per request."""

from __future__ import annotations

from collections import Counter

from ..commands.common import CommandError
from ..request.timeline import spread


def breakdown(client_ms: dict, recent: list[dict]) -> dict:
    """The server's stages of each answered request beside this client's own latency for it: per
    stage p50/p95/mean, and how much of the client's latency the stages account for."""
    rows = []
    for entry in recent:
        if entry.get("id") in client_ms:
            rows.append({"id": entry["id"], "client_ms": round(client_ms[entry["id"]], 3), "kind": entry["kind"],
                         "server_ms": entry["total_ms"], "stages_ms": dict(entry["stages_ms"]), "steps": entry["steps"],
                         "tokens": entry.get("tokens", 0), "stop_reason": entry.get("stop_reason", "")})
    if not rows:
        return {"requests": 0, "stages": {}, "rows": []}
    names = []
    for row in rows:
        row["stages_ms"]["transport"] = round(max(0.0, row["client_ms"] - row["server_ms"]), 3)
        names += [n for n in row["stages_ms"] if n not in names]
    names.remove("transport")
    names.append("transport")  # the pipes and this client: what the server cannot see

    stages = {name: spread([row["stages_ms"].get(name, 0.0) for row in rows], 2) for name in names}
    client = [row["client_ms"] for row in rows]
    server = [row["server_ms"] for row in rows]
    steps = [step for row in rows for step in row["steps"]]
    kinds = Counter(row["kind"] for row in rows)
    stops = Counter(row["stop_reason"] for row in rows if row["stop_reason"])
    generated = [row for row in rows if row["tokens"]]
    tokens = sorted(row["tokens"] for row in generated)
    return {
        "requests": len(rows), "kinds": dict(kinds), "stages": stages,
        "client_ms": spread(client, 2), "server_ms": spread(server, 2),
        # the server's stages, summed over the requests, as a share of what the client measured
        "server_share_of_client": round(sum(server) / sum(client), 4) if sum(client) else None,
        "stop_reasons": dict(stops),
        "tokens_per_request": {"p50": tokens[len(tokens) // 2], "mean": round(sum(tokens) / len(tokens), 2)}
        if tokens else None,
        # the decoding loop's time per generated token, over the requests that generated any
        "decode_ms_per_token": round(sum(r["stages_ms"].get("decode", 0.0) for r in generated) / sum(tokens), 3)
        if tokens else None,
        "decode_steps": {"count": len(steps), "drafted": sum(s[0] for s in steps), "accepted": sum(s[1] for s in steps),
                         "ms_mean": round(sum(s[3] for s in steps) / len(steps), 3) if steps else None},
        "rows": rows,
    }


def prefill_per_keystroke(client_ms: dict, recent: list[dict]) -> dict | None:
    """Prompt tokens prefilled for each answered request that ran the model (its own, and what
    warm-ups computed for it after the edits before it): p50/p95, and by where the prompt first
    differed from the last one (request/prompt_moves.py): requests, tokens and their p50/p95."""
    rows = [e for e in recent if e.get("id") in client_ms and e.get("kind") == "generated" and e.get("prefill_cause")]
    if not rows:
        return None
    tokens = [e["prefilled_tokens"] + e["prefilled_ahead"] for e in rows]
    counts: dict[str, list[int]] = {}
    for entry, count in zip(rows, tokens):
        counts.setdefault(entry["prefill_cause"], []).append(count)
    by_cause = {cause: {"requests": len(c), "tokens": sum(c), **spread(c, 1)} for cause, c in counts.items()}
    return {"requests": len(rows), **spread(tokens, 1),
            "ahead_share": round(sum(e["prefilled_ahead"] for e in rows) / sum(tokens), 4) if sum(tokens) else 0.0,
            "by_cause": by_cause}


def plot_breakdowns(results: list[dict], path: str) -> None:
    """A stacked bar per answered request (one panel per pause mode), stages in order."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CommandError("--plot needs matplotlib: pip install 'memosight[plot]'") from None
    panels = [r for r in results if r.get("breakdown", {}).get("rows")]
    if not panels:
        raise CommandError("--plot needs --breakdown and at least one answered request")
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 3.5 * len(panels)), squeeze=False)
    for ax, result in zip(axes[:, 0], panels):
        rows, names = result["breakdown"]["rows"], list(result["breakdown"]["stages"])
        bottom = [0.0] * len(rows)
        colours = plt.get_cmap("tab20")
        for i, name in enumerate(names):
            values = [row["stages_ms"].get(name, 0.0) for row in rows]
            ax.bar(range(len(rows)), values, bottom=bottom, width=1.0, label=name, color=colours(i % 20))
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_title(f"pause {result['pause_ms']:g} ms: {len(rows)} requests, client p50 "
                     f"{result['breakdown']['client_ms']['p50']} ms")
        ax.set_xlabel("request")
        ax.set_ylabel("ms")
        ax.legend(ncol=6, fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


