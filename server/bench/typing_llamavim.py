"""llama.vim's request logic as `memosight bench typing` types into it, on a real llama-server.

A reimplementation, from reading, of the FIM part of ggml-org/llama.vim `autoload/llama.vim` at commit
a1c8e6e40cb45df59b78add5b65d575386832465 (2026-01-31), with its default `g:llama_config`:

- events (`llama#setup_autocmds`, auto_fim): an edit is CursorMovedI, which runs `s:on_move` (hide the
  hint, show one from the cache at once) and then `llama#fim(-1, -1, v:true, [], v:true)`; open() is
  BufEnter (a chunk is picked 100 ms later if the buffer is unmodified); close() is InsertLeavePre
  (hide) and BufLeave (pick a chunk, unmodified buffers only). Tab (accepted=True) is `llama#fim_accept`,
  whose own state change is `llama#fim_hide`; the benchmark has already put the text in.
- `s:fim_ctx_local`: n_prefix lines, the line before the cursor as the prompt ("middle"), the rest of
  the line and n_suffix lines as suffix; a blank line restarts at column 0; with `prev` (prefetch) the
  context is built as if the shown hint were accepted.
- `llama#fim`: one request in flight (`s:current_job_fim`): a trigger meanwhile re-arms a single 100 ms
  retry timer; the max_line_suffix rule; no request when one of the 4 context hashes is cached; the
  first request gets t_max_predict_ms 250, a prefetch the configured one; ring chunks similar (>0.5)
  to a chunk of the current text are evicted; chunks far above / below are picked when the cursor moved
  more than 32 lines since the last pick; the /infill body exactly as sent (model "" and an empty Bearer
  header included: llama.vim's `len("g:llama_config.model_fim")` test is always true).
- `s:fim_on_response` (Neovim's buffered stdout: runs before `s:fim_on_exit` frees the job slot): the
  same validity checks, the raw answer cached under every hash, shown via `s:fim_try_hint` only when no
  acceptable hint is on screen. Answers for another position are thereby shown only through the cache.
- `s:fim_try_hint`: exact hash, else the 128-character look-back (its odd "best" bookkeeping kept);
  after a render the prefetch `llama#fim(x, y, v:true, content, v:true)`.
- `s:fim_render`: trailing empty lines dropped, blank-line indentation trimmed, the rules that blank a
  suggestion repeating the suffix / the next lines, the line suffix appended, whitespace-only not
  acceptable. visible() is what `llama#fim_accept('full')` would add at the cursor.
- `s:cache_insert` / `s:cache_get`: LRU of max_cache_keys (it evicts at the limit even on an update).
- the ring of extra context: llamavim_ring.py; every ring_update_ms (outside insert mode, or
  after 3 s without a cursor move) one queued chunk moves into it and an n_predict 0 request is sent.

Deliberate differences: Vim counts bytes (col('.'), len(), string slices), this counts characters (the
same on ASCII code); no info display (show_info only formats text), no instruct, no popup menu; curl
jobs are asyncio tasks over raw loopback HTTP; timers are loop.call_later handles; `s:rand`'s rand() is
a random.Random (seedable for tests); `reltime()` in a chunk is [seconds, microseconds] of the monotonic
clock; a text that ends with "\\n" is Vim's buffer without that last empty line; between close() and
open() no buffer is current, so a retry timer that fires then sends nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import re
import time

from .loopback_http import post_json
from .llamavim_ring import Ring
from .typing_lsp import process_cpu_seconds
from .typing_system import SystemStats

DEFAULT_CONFIG = {  # the FIM part of llama.vim's s:default_config
    "endpoint_fim": "", "model_fim": "", "api_key": "",
    "n_prefix": 256, "n_suffix": 64, "n_predict": 128, "stop_strings": [],
    "t_max_prompt_ms": 500, "t_max_predict_ms": 1000, "show_info": 2, "auto_fim": True,
    "max_line_suffix": 8, "max_cache_keys": 250,
    "ring_n_chunks": 16, "ring_chunk_size": 64, "ring_scope": 1024, "ring_update_ms": 1000,
}
RESPONSE_FIELDS = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
                   "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
                   "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"]
SPACES = re.compile(r"[ \t]*")  # Vim's \s* (\s is a space or a tab)
CONTENT_FIELD = re.compile(r'"content"\s*:"')  # s:fim_on_response's quick check, compact JSON only


def is_blank(s: str) -> bool:
    return SPACES.fullmatch(s) is not None  # Vim's s =~ '^\s*$'


def indent_of(s: str) -> int:
    return SPACES.match(s).end()


def vim_upto(s: str, n: int) -> str:
    """Vim's s[:n]: the end is inclusive and a negative one counts from the end ([:-1] is all)."""
    n = len(s) + n if n < 0 else n
    return s[:n + 1] if n >= 0 else ""


def ctx_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class LlamaVimSystem:
    """llama.vim's FIM client logic against a llama-server at `url` (its base URL, or /infill itself)."""

    name = "llamavim"
    RING_IDLE_S = 3.0  # s:ring_update: in insert mode only after this long without a cursor move
    BUFENTER_PICK_S = 0.1  # BufEnter's timer_start(100, ...)
    RETRY_S = 0.1  # llama#fim's timer while a job is in flight
    FIRST_PREDICT_MS = 250  # llama#fim: the first request is quick, the prefetch gets t_max_predict_ms

    def __init__(self, url: str, *, server_pid: int | None = None, config: dict | None = None,
                 seed: int | None = None):
        self.cfg = {**DEFAULT_CONFIG, **(config or {})}
        if not self.cfg["endpoint_fim"]:
            self.cfg["endpoint_fim"] = url if url.rstrip("/").endswith("/infill") else url.rstrip("/") + "/infill"
        self.server_pid = server_pid
        self.rng = random.Random(seed)
        # the buffer: lines (None: no buffer current), 1-based line y, 0-based column x, Vim's mode
        self.lines: list[str] | None = None
        self.y, self.x, self.path, self.modified, self.mode = 1, 0, "", False, "n"
        # llama#init's script state
        self.cache: dict[str, str] = {}  # insertion order = g:cache_lru_order
        self.ring = Ring(self.cfg, self.rng)
        self.hint_shown = False
        self.fim_data: dict = {}
        self.pos_y_pick = -9999
        self.indent_last = -1
        self.t_last_move = time.monotonic()
        self.job: asyncio.Task | None = None  # s:current_job_fim
        self.timer_fim: asyncio.TimerHandle | None = None
        self.timer_ring: asyncio.TimerHandle | None = None
        self.timer_enter: asyncio.TimerHandle | None = None  # BufEnter's pick (the latest open's)
        self.background: set[asyncio.Task] = set()  # ring update requests (no callbacks)
        # the benchmark's accounting
        self.stats = SystemStats()
        self.count = {k: 0 for k in ("fim", "prefetch", "ring_update", "failed", "retries_armed", "skipped_cached",
                                     "skipped_line_suffix", "cache_hits_exact", "cache_hits_lookback",
                                     "responses", "responses_invalid", "responses_cached_only",
                                     "responses_not_shown", "hints_shown")}
        self.edited_at: float | None = None
        self._cpu_start = 0.0

    # --- the TypingSystem events ---------------------------------------------------------------

    async def start(self) -> None:
        self._cpu_start = process_cpu_seconds(self.server_pid)
        if self.cfg["ring_n_chunks"] > 0:  # llama#enable: init background update of the ring buffer
            self._ring_update()

    async def open(self, path: str, text: str, cursor: int) -> None:
        self.path, self.modified = path, False
        self._set_buffer(text, cursor)
        # BufEnter: timer_start(100, pick a chunk around the cursor of whatever buffer is current then)
        self.timer_enter = asyncio.get_running_loop().call_later(self.BUFENTER_PICK_S, self._pick_around_cursor)
        self.t_last_move = time.monotonic()  # the cursor was put there (CursorMoved, normal mode)
        self.mode = "i"  # then the user enters insert mode (no FIM until the first move in it)

    async def edit(self, text: str, cursor: int, inserted: str, accepted: bool) -> None:
        self._set_buffer(text, cursor)
        self.modified = True
        self.edited_at = time.perf_counter()
        if accepted:  # llama#fim_accept: the text (already in) ... then llama#fim_hide()
            self._fim_hide()
        if not self.cfg["auto_fim"]:
            self._fim_hide()
            return
        # CursorMovedI, in the order the autocmds are defined
        self._on_move()
        self.fim(-1, -1, True, [], True)

    def visible(self) -> str:
        """The text `llama#fim_accept('full')` would put in at the cursor: the shown lines without the
        line's old suffix, which the last line carries (it is already after the cursor)."""
        if not self.hint_shown or not self.fim_data.get("can_accept"):
            return ""
        text, suffix = "\n".join(self.fim_data["content"]), self.fim_data["line_cur_suffix"]
        return text[:len(text) - len(suffix)]

    async def close(self, path: str) -> None:
        self._fim_hide()  # InsertLeavePre
        self._pick_around_cursor()  # BufLeave
        self.mode, self.lines = "n", None

    async def stop(self) -> SystemStats:
        for handle in (self.timer_fim, self.timer_ring, self.timer_enter):
            if handle is not None:
                handle.cancel()
        tasks = [t for t in [self.job, *self.background] if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.stats.model_cpu_s = process_cpu_seconds(self.server_pid) - self._cpu_start
        self.stats.notes = {**self.count, "cache_keys": len(self.cache), "ring_chunks": len(self.ring.chunks),
                            "ring_queued": len(self.ring.queued), "ring_evicted": self.ring.n_evict}
        return self.stats

    # --- the buffer, as Vim's getline() sees it ---------------------------------------------------

    def _set_buffer(self, text: str, cursor: int) -> None:
        lines = text.split("\n")
        self.y = text.count("\n", 0, cursor) + 1
        self.x = cursor - (text.rfind("\n", 0, cursor) + 1)
        if len(lines) > 1 and lines[-1] == "" and self.y < len(lines):
            lines.pop()  # the file's last end of line, not a line
        self.lines = lines

    def getline(self, n: int) -> str:
        return self.lines[n - 1] if self.lines and 1 <= n <= len(self.lines) else ""

    def getlines(self, a: int, b: int) -> list[str]:
        if not self.lines or a > b:
            return []
        return self.lines[max(a, 1) - 1:max(0, min(b, len(self.lines)))]

    def _around_cursor(self) -> list[str]:
        half = self.cfg["ring_chunk_size"] // 2
        return self.getlines(max(1, self.y - half), min(self.y + half, len(self.lines or [])))

    # --- s:cache_insert / s:cache_get -------------------------------------------------------------

    def _cache_insert(self, key: str, value: str) -> None:
        if len(self.cache) > self.cfg["max_cache_keys"] - 1:
            del self.cache[next(iter(self.cache))]  # the least recently used, even when key is present
        self.cache.pop(key, None)
        self.cache[key] = value

    def _cache_get(self, key: str) -> str | None:
        if key not in self.cache:
            return None
        self.cache[key] = self.cache.pop(key)
        return self.cache[key]

    # --- the ring of extra context --------------------------------------------------------------

    @property
    def ring_chunks(self) -> list[dict]:
        return self.ring.chunks

    @property
    def ring_queued(self) -> list[dict]:
        return self.ring.queued

    def _pick_around_cursor(self) -> None:
        """BufEnter / BufLeave: a chunk around the cursor of the current (unmodified, file) buffer."""
        if self.lines is not None:
            self._pick_chunk(self._around_cursor(), no_mod=True, do_evict=True)

    def _pick_chunk(self, text: list[str], no_mod: bool, do_evict: bool) -> None:
        self.ring.pick(text, self.path, self.modified, no_mod, do_evict)

    def _ring_update(self) -> None:
        """s:ring_update: every ring_update_ms, when idle, move one queued chunk into the ring and let
        the server process it (n_predict 0) so that it is cached for the next FIM."""
        self.timer_ring = asyncio.get_running_loop().call_later(self.cfg["ring_update_ms"] / 1000, self._ring_update)
        if self.mode != "n" and time.monotonic() - self.t_last_move < self.RING_IDLE_S:
            return
        if not self.ring.rotate():
            return
        request = {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": self.ring.extra(),
                   "prompt": "", "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False,
                   "cache_prompt": True, "t_max_prompt_ms": 1, "t_max_predict_ms": 1, "response_fields": [""],
                   "model": self.cfg["model_fim"]}
        self.count["ring_update"] += 1
        task = asyncio.create_task(self._send(request))  # no callbacks: the answer is not read
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    # --- FIM ------------------------------------------------------------------------------------

    def _ctx_local(self, pos_x: int, pos_y: int, prev: list[str]) -> dict:
        """s:fim_ctx_local: prefix / middle / suffix around (pos_x, pos_y), or, with `prev`, as if the
        suggestion `prev` were already inserted there."""
        n_prefix, n_suffix = self.cfg["n_prefix"], self.cfg["n_suffix"]
        max_y = len(self.lines or [])
        if not prev:
            line_cur = self.getline(pos_y)
            line_cur_prefix, line_cur_suffix = line_cur[:pos_x], line_cur[pos_x:]
            lines_prefix = self.getlines(max(1, pos_y - n_prefix), pos_y - 1)
            if is_blank(line_cur):  # a line of whitespace: start from the beginning of the line
                indent, line_cur_prefix, line_cur_suffix = 0, "", ""
            else:
                indent = indent_of(line_cur)
        else:
            line_cur = self.getline(pos_y) + prev[0] if len(prev) == 1 else prev[-1]
            line_cur_prefix, line_cur_suffix = line_cur, ""
            lines_prefix = self.getlines(max(1, pos_y - n_prefix + len(prev) - 1), pos_y - 1)
            if len(prev) > 1:
                lines_prefix += [self.getline(pos_y) + prev[0], *prev[1:-1]]
            indent = self.indent_last
        lines_suffix = self.getlines(pos_y + 1, min(max_y, pos_y + n_suffix))
        return {"prefix": "\n".join(lines_prefix) + "\n", "middle": line_cur_prefix,
                "suffix": line_cur_suffix + "\n" + "\n".join(lines_suffix) + "\n", "indent": indent,
                "line_cur_suffix": line_cur_suffix}

    def fim(self, a_pos_x: int, a_pos_y: int, is_auto: bool, prev: list[str], use_cache: bool) -> None:
        """llama#fim: send the local context and the ring to /infill, unless it is cached or a request
        is in flight (then retry in 100 ms, one retry pending at most)."""
        if self.lines is None:
            return
        pos_x = self.x if a_pos_x < 0 else a_pos_x
        pos_y = self.y if a_pos_y < 0 else a_pos_y
        if self.job is not None:  # avoid sending repeated requests too fast
            if self.timer_fim is not None:
                self.timer_fim.cancel()
            self.timer_fim = asyncio.get_running_loop().call_later(
                self.RETRY_S, self.fim, a_pos_x, a_pos_y, True, prev, use_cache)
            self.count["retries_armed"] += 1
            return
        ctx = self._ctx_local(pos_x, pos_y, prev)
        prefix, middle, suffix = ctx["prefix"], ctx["middle"], ctx["suffix"]
        if is_auto and len(ctx["line_cur_suffix"]) > self.cfg["max_line_suffix"]:
            self.count["skipped_line_suffix"] += 1
            return
        t_max_predict_ms = self.cfg["t_max_predict_ms"] if prev else self.FIRST_PREDICT_MS
        # hashes of the context with up to 3 first lines dropped: found again after scrolling down
        hashes = [ctx_hash(prefix + middle + "Î" + suffix)]
        prefix_trim = prefix
        for _ in range(3):
            prefix_trim = re.sub(r"^[^\n]*\n", "", prefix_trim, count=1)
            if not prefix_trim:
                break
            hashes.append(ctx_hash(prefix_trim + middle + "Î" + suffix))
        if use_cache and any(self._cache_get(h) is not None for h in hashes):
            self.count["skipped_cached"] += 1
            return
        self.indent_last = ctx["indent"]
        # evict ring chunks very similar to the text here: they make the model repeat what is there
        self.ring.evict_like(self.ring.random_chunk(self._around_cursor()), above=0.5)
        request = {"id_slot": 0, "input_prefix": prefix, "input_suffix": suffix,
                   "input_extra": self.ring.extra(), "prompt": middle, "n_predict": self.cfg["n_predict"],
                   "stop": self.cfg["stop_strings"], "n_indent": ctx["indent"], "top_k": 40, "top_p": 0.90,
                   "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True,
                   "t_max_prompt_ms": self.cfg["t_max_prompt_ms"], "t_max_predict_ms": t_max_predict_ms,
                   "response_fields": RESPONSE_FIELDS, "model": self.cfg["model_fim"]}
        self.count["prefetch" if prev else "fim"] += 1
        self.job = asyncio.create_task(self._fim_job(request, hashes))
        # gather extra context nearby only when the cursor moved a lot since the last pick
        if is_auto and abs(pos_y - self.pos_y_pick) > 32:
            max_y, cfg = len(self.lines), self.cfg
            self._pick_chunk(self.getlines(max(1, pos_y - cfg["ring_scope"]), max(1, pos_y - cfg["n_prefix"])),
                             False, False)
            self._pick_chunk(self.getlines(min(max_y, pos_y + cfg["n_suffix"]),
                                           min(max_y, pos_y + cfg["n_suffix"] + cfg["ring_chunk_size"])),
                             False, False)
            self.pos_y_pick = pos_y

    async def _send(self, request: dict) -> tuple[str, bool]:
        self.stats.requests += 1
        raw, ok = await post_json(self.cfg["endpoint_fim"], request,
                                  {"Authorization": "Bearer " + self.cfg["api_key"]})
        self.count["failed"] += not ok
        return raw, ok

    async def _fim_job(self, request: dict, hashes: list[str]) -> None:
        try:
            raw, _ = await self._send(request)
            self._on_response(hashes, raw)  # on_stdout (buffered) comes before on_exit
        finally:
            if self.job is asyncio.current_task():
                self.job = None  # s:fim_on_exit

    def _on_response(self, hashes: list[str], raw: str) -> None:
        """s:fim_on_response: cache a valid answer under all its hashes; show it (through the cache,
        at the cursor as it is now) only if no acceptable hint is on screen."""
        if not raw:
            return
        self.count["responses"] += 1
        if not re.match(r"[ \t]*\{", raw) or not CONTENT_FIELD.search(raw):
            self.count["responses_invalid"] += 1
            return
        try:
            json.loads(raw)
        except ValueError:
            self.count["responses_invalid"] += 1
            return
        for h in hashes:
            self._cache_insert(h, raw)
        if not self.hint_shown or not self.fim_data["can_accept"]:
            self._try_hint(self.x, self.y)
            self.count["responses_not_shown"] += not self.visible()  # for another position, or a repeat
        else:
            self.count["responses_cached_only"] += 1

    def _on_move(self) -> None:
        self.t_last_move = time.monotonic()
        self._fim_hide()
        self._try_hint(self.x, self.y)

    def _fim_hide(self) -> None:
        self.hint_shown = False

    def _try_hint(self, pos_x: int, pos_y: int) -> None:
        """s:fim_try_hint: render a cached completion for this context, or one cached up to 128
        characters back whose text starts with what was typed since; then prefetch what follows it."""
        if self.mode != "i" or self.lines is None:
            return
        ctx = self._ctx_local(pos_x, pos_y, [])
        raw = self._cache_get(ctx_hash(ctx["prefix"] + ctx["middle"] + "Î" + ctx["suffix"]))
        response = json.loads(raw) if raw is not None else None
        if response is not None:
            self.count["cache_hits_exact"] += 1
        else:
            pm, best = ctx["prefix"] + ctx["middle"], 0
            for i in range(128):
                cut = max(0, len(pm) - 1 - i)  # Vim's pm[-(1+i):] and pm[:-(2+i)] at the string's edges
                removed = pm[cut:]
                cached = self._cache_get(ctx_hash(pm[:cut] + "Î" + ctx["suffix"]))
                if not cached:
                    continue
                candidate = json.loads(cached)
                content = candidate.get("content", "")
                if content[:i + 1] != removed:
                    continue
                candidate["content"] = content[i + 1:]
                if candidate["content"]:
                    if response is None:  # llama.vim leaves best at 0 for the first one found
                        response = candidate
                    elif len(candidate["content"]) > best:
                        best, response = len(candidate["content"]), candidate
            if response is not None:
                self.count["cache_hits_lookback"] += 1
        if response is not None:
            self._render(pos_x, pos_y, response)
            if self.hint_shown:  # speculative FIM for what follows the hint, in the background
                self.fim(pos_x, pos_y, True, self.fim_data["content"], True)

    def _render(self, pos_x: int, pos_y: int, response: dict) -> None:
        """s:fim_render: the suggestion's lines as shown at (pos_x, pos_y), minus the repeats."""
        content = response.get("content", "").split("\n")
        while content and content[-1] == "":
            content.pop()
        can_accept = bool(content)
        content = content or [""]
        line_cur = self.getline(pos_y)
        if is_blank(line_cur):  # trim as much leading whitespace from the suggestion as the line has
            lead = min(indent_of(content[0]), len(line_cur))
            line_cur, content[0] = content[0][:lead], content[0][lead:]
        line_cur_prefix, line_cur_suffix = line_cur[:pos_x], line_cur[pos_x:]
        # discard suggestions that repeat existing text: an empty first line and the next lines ...
        if len(content) > 1 and content[0] == "" and content[1:] == self.getlines(pos_y + 1, pos_y + len(content) - 1):
            content = [""]
        # ... the suffix ...
        if len(content) == 1 and content[0] == line_cur_suffix:
            content = [""]
        # ... or the next non-blank line(s)
        cmp_y = pos_y + 1
        while cmp_y < len(self.lines) and is_blank(self.getline(cmp_y)):
            cmp_y += 1
        if line_cur_prefix + content[0] == self.getline(cmp_y):
            if len(content) == 1:
                content = [""]
            if len(content) == 2 and content[-1] == vim_upto(self.getline(cmp_y + 1), len(content[-1]) - 1):
                content = [""]
            if len(content) > 2 and "\n".join(content[1:]) == "\n".join(
                    self.getlines(cmp_y + 1, cmp_y + len(content) - 1)):
                content = [""]
        content[-1] += line_cur_suffix
        if is_blank("\n".join(content)):
            can_accept = False
        self.hint_shown = True
        self.fim_data = {"pos_x": pos_x, "pos_y": pos_y, "line_cur": line_cur, "line_cur_suffix": line_cur_suffix,
                         "can_accept": can_accept, "content": content}
        if self.visible() and self.edited_at is not None:  # the first hint on screen since this edit
            self.count["hints_shown"] += 1
            self.stats.latencies_ms.append((time.perf_counter() - self.edited_at) * 1000)
            self.edited_at = None
