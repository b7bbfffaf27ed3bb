"""End to end: a real headless Neovim loads editors/nvim, starts the server, shows its inline completion
as ghost text, accepts it with <Tab>, and the server counts the acceptance.

Neovim is driven by a Lua script that runs as a coroutine on Neovim's own event loop: keys go in with
nvim_input (as if typed, so mappings and InsertEnter/CursorMovedI fire), waits poll with timers, and the
observations are written as JSON that the Python side asserts on. The harness (DRIVER_PRELUDE with
wait_for, status, run and the like, and the `headless_nvim` fixture) is in conftest.py.
"""

from __future__ import annotations

import time

DRIVER_LUA = r"""
out.notifications = {}

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

run(function()
  local buf, client = open_file()
  out.offset_encoding = client.offset_encoding -- what Neovim counts LSP columns in, as the server said
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

  out.line_after = accept_with_tab()
  out.cursor = vim.api.nvim_win_get_cursor(0)
  note("accepted: " .. out.line_after)

  out.status = status_once_accepted(buf, 1)
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
  stop_server(client)
end)
"""


def test_inline_completion_is_shown_accepted_and_counted(headless_nvim, repeater_model_dir):
    started = time.monotonic()
    out = headless_nvim.run(DRIVER_LUA, repeater_model_dir)

    suggestion = "x" * headless_nvim.max_new_tokens  # the repeater model emits "x" until max_new_tokens
    assert out["enabled"]
    # Neovim offers utf-8 first; the server's documents count UTF-16 units, and says so
    assert out["offset_encoding"] == "utf-16"
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


BACKEND_DRIVER_LUA = r"""
if not (vim.lsp and vim.lsp.inline_completion) then
  out.skip = "this Neovim has no vim.lsp.inline_completion (needs 0.12)"
  finish(nil)
  return
end
run(function()
  local buf, client = open_file()
  wait_for("inline completion on the buffer", 10000, function()
    return vim.tbl_get(vim.lsp, "_capability", "all", "inline_completion", "active", buf)
  end)
  vim.api.nvim_input("GA")
  local ns = vim.api.nvim_create_namespace("nvim.lsp.inline_completion")
  out.ghost = wait_for("ghost text from the llama.cpp server", 50000, function()
    for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(buf, ns, 0, -1, { details = true })) do
      local parts = {}
      for _, chunk in ipairs(mark[4].virt_text or {}) do table.insert(parts, chunk[1]) end
      if #parts > 0 then return table.concat(parts) end
    end
  end)
  out.line_after = accept_with_tab()
  out.status = status_once_accepted(buf, 1)
  vim.api.nvim_input("<Esc>")
  stop_server(client)
end)
"""


def test_the_same_plugin_completes_through_a_real_llama_cpp_server(headless_nvim, repeater_model_dir, llama_server):
    url, _ = llama_server
    out = headless_nvim.run(BACKEND_DRIVER_LUA, repeater_model_dir, backend_url=url, show=("ghost",))
    assert out["ghost"] and not out["ghost"].startswith("x" * 3)  # the server's model, not the local repeater
    assert out["line_after"] == "    return " + out["ghost"]
    backend = out["status"]["backend"]
    assert backend["kind"] == "openai" and backend["state"] == "ok" and backend["fallback_requests"] == 0


VISITS_DRIVER_LUA = r"""
run(function()
  local buf, client = open_file()
  out.warm_ups = wait_for("the prompt prefilled on entering the buffer", 10000, function()
    local result = status(buf)
    return result and result.requests.warm_ups > 0 and result.requests.warm_ups
  end)
  vim.api.nvim_input("2Gyy") -- a yank on the second line
  local function rows()
    local result = status(buf)
    return result and result.recent_rows and result.recent_rows[vim.uri_from_bufnr(buf)]
  end
  out.after_yank = wait_for("the yank to reach the server", 10000, rows)
  vim.api.nvim_win_set_cursor(0, { 3, 0 })
  vim.cmd("split | enew") -- leaving the buffer from its third line (too near the yank: the same area)
  out.after_leave = wait_for("the leave to reach the server", 10000, function()
    local r = status(buf).recent_rows[vim.uri_from_bufnr(buf)]
    return r and r[1] == 2 and r
  end)
  stop_server(client)
end)
"""


def test_yanks_and_leaving_a_buffer_tell_the_server_where_the_user_was(headless_nvim, repeater_model_dir):
    out = headless_nvim.run(VISITS_DRIVER_LUA, repeater_model_dir)
    assert out["warm_ups"] >= 1  # the buffer on screen when the client attached
    assert out["after_yank"] == [1]
    assert out["after_leave"] == [2]  # the same area as the yank: one row, the latest


NON_ASCII_DRIVER_LUA = r"""
run(function()
  local buf, client = open_file()
  -- Typed edits on a line with characters outside ASCII, before and after them: Neovim sends their
  -- ranges in the columns the server asked for, and the server's copy must stay the buffer's.
  vim.api.nvim_input('Gos = "é😀 ü"<Left><Left>X<Esc>A # ñ<Esc>0wiy<Esc>') -- X before ü, y before =
  wait_for("the edits to land", 10000, function()
    local line = vim.api.nvim_get_current_line()
    out.line, out.mode = line, vim.api.nvim_get_mode().mode
    return vim.api.nvim_get_mode().mode == "n" and line:find("ñ", 1, true) and line:find("y=", 1, true)
  end)
  local text = table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), "\n") .. "\n"
  out.want = vim.fn.sha256(text):sub(1, 16)
  out.line = vim.api.nvim_get_current_line()
  local uri = vim.uri_from_bufnr(buf)
  out.have = wait_for("the server's copy to equal the buffer", 10000, function()
    local reply
    client:request("memosight/status", { digests = true }, function(err, result) reply = { err = err, result = result } end, buf)
    reply = wait_for("memosight/status", 10000, function() return reply end)
    local digest = reply.result and reply.result.digests[uri]
    if digest == out.want then return digest end
    out.last = digest
    sleep(200)
  end)
  stop_server(client)
end)
"""


def test_edits_around_characters_outside_ascii_keep_the_server_s_copy_equal_to_the_buffer(headless_nvim,
                                                                                         repeater_model_dir):
    out = headless_nvim.run(NON_ASCII_DRIVER_LUA, repeater_model_dir, show=("line", "mode", "last"))
    assert out["line"] == 's y= "é😀 Xü" # ñ'  # each edit lands after a character of 2 or 4 UTF-8 bytes
    assert out["have"] == out["want"]
