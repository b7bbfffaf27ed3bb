"""memosight/status: what the server says about itself. The engine's state and figures (the
suggester's), the settings in force, the open documents' recent rows, and what each bounded
structure holds beside the process's memory (bench fuzz reads it at its peak)."""

from __future__ import annotations

import dataclasses
import os
import resource

import attrs

from . import __version__
from .documents import text_digest


@attrs.define
class StatusParams:
    """memosight/status: {"recent": bool, "digests": bool}, both optional."""

    recent: bool = False  # the last requests' timelines too (bench replay --breakdown)
    digests: bool = False  # each open document's text digest (what bench fuzz checks texts by)


def status_answer(ls, params: StatusParams) -> dict:
    """The answer to memosight/status for the server `ls` (lsp.MemoSightServer)."""
    out = ls.suggester.status(ls.settings)
    if params.recent:
        out["breakdown"] = ls.suggester.stages.to_json(recent=True)
    out["version"] = __version__
    out["documents"] = len(ls.documents.all())
    # where the user worked, looked or yanked lately, per open document (rows, most recent first)
    out["recent_rows"] = {d.uri: list(d.recent_rows) for d in ls.documents.all() if d.recent_rows}
    out["settings"] = dataclasses.asdict(ls.settings)
    out["memory"] = memory_report(ls, out)
    out["peak_rss_mb"] = out["memory"]["peak_rss_mb"]
    if params.digests:
        out["digests"] = {d.uri: text_digest(d.text) for d in ls.documents.all()}
    return out


def memory_report(ls, status: dict) -> dict:
    """What each bounded structure holds now, beside the process's memory (bench fuzz reads it at
    its peak): documents, caches, requests in flight, the engine's KV cache of earlier prompts."""
    tree = ((status.get("cache") or {}).get("prefix_tree") or {})
    index = ls.workspace_index
    rss = _rss_mb()
    # Linux (KiB). The kernel's high-water mark misses pages handed back by madvise (glibc's free)
    # between the two reads, so the peak is at least what was resident.
    peak = max(round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1), rss or 0.0)
    return {"rss_mb": rss, "peak_rss_mb": peak, "documents": ls.documents.memory(),
            "completion_cache_entries": status["completion_cache"]["entries"],
            "requests_in_flight": ls.connection.in_flight(), **ls.suggester.memory(),
            "workspace_files": 0 if index is None else len(index),
            "kv_prefix_tree_mb": round(tree.get("bytes", 0) / 2**20, 1)}


def _rss_mb() -> float | None:
    try:
        with open("/proc/self/statm") as f:
            return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)
    except (OSError, ValueError, IndexError):
        return None
