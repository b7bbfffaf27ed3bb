"""End to end for the extmark backend (the Neovim 0.10-0.11 path), run on 0.12 with `backend = "extmark"`:
the plugin requests inline completions itself, draws them with extmarks, streams the server's
memosight/partialCompletion notifications, accepts with <Tab> (the server counts it), shows the rest of the
suggestion when the user types its beginning, and dismisses with <C-]>. A second part holds the requests in
the client and answers them by hand: cancellation of the older request, stale partials and responses
dropped, a multi-line suggestion drawn and inserted.

As in test_nvim.py, a Lua driver runs as a coroutine on Neovim's loop, types with nvim_input and writes
its observations as JSON; the harness (DRIVER_PRELUDE and the `headless_nvim` fixture) is in conftest.py.
"""

from __future__ import annotations

import json
import subprocess
import time

DRIVER_LUA = r"""
out.partials = {}

local ns = vim.api.nvim_create_namespace("memosight.ghost")

-- The ghost text drawn at the cursor: inline virt_text, then the virt_lines joined with newlines.
local function ghost_text(buf)
  local row, col = unpack(vim.api.nvim_win_get_cursor(0))
  for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(buf, ns, 0, -1, { details = true })) do
    if mark[2] == row - 1 and mark[3] == col then
      local lines = { "" }
      for _, chunk in ipairs(mark[4].virt_text or {}) do
        lines[1] = lines[1] .. chunk[1]
        out.hl_group = chunk[2]
      end
      for _, vline in ipairs(mark[4].virt_lines or {}) do
        local parts = {}
        for _, chunk in ipairs(vline) do table.insert(parts, chunk[1]) end
        table.insert(lines, table.concat(parts))
      end
      out.virt_text_pos = mark[4].virt_text_pos
      return table.concat(lines, "\n")
    end
  end
  return nil
end

local function any_ghost(buf)
  return #vim.api.nvim_buf_get_extmarks(buf, ns, 0, -1, {}) > 0
end

run(function()
  out.backend = require("memosight").backend()
  local buf, client = open_file()
  out.asked_for_partials = vim.tbl_get(client.config.capabilities, "experimental", "memosight", "partialCompletion")
  out.native_enabled = vim.lsp.inline_completion ~= nil and vim.lsp.inline_completion.is_enabled({ bufnr = buf })

  -- Record every partial notification and what the plugin drew right after handling it.
  local handler = assert(client.handlers["memosight/partialCompletion"], "no partialCompletion handler")
  client.handlers["memosight/partialCompletion"] = function(err, params, ctx)
    handler(err, params, ctx)
    table.insert(out.partials, { text = params.text, drawn = ghost_text(buf) or vim.NIL,
                                 at = (vim.uv.hrtime() - started) / 1e9 })
  end

  vim.api.nvim_input("GA") -- insert mode at the end of `    return `
  out.ghost = wait_for("ghost text", 50000, function() return ghost_text(buf) end)
  out.ghost = wait_for("the final ghost text", 20000, function()
    local text = ghost_text(buf)
    return text and #text >= 8 and text
  end)
  out.partials_before_final = #out.partials
  out.line_before = vim.api.nvim_get_current_line()
  note("ghost text: " .. out.ghost .. " after " .. #out.partials .. " partials")

  out.line_after = accept_with_tab()
  out.cursor = vim.api.nvim_win_get_cursor(0)
  out.mode_after_accept = vim.api.nvim_get_mode().mode
  note("accepted: " .. out.line_after)

  out.status = status_once_accepted(buf, 1)
  note("status: accepted=" .. out.status.requests.accepted)

  -- Accepting changed the buffer: a new suggestion comes at the new cursor.
  out.second_ghost = wait_for("a second ghost text", 30000, function()
    local text = ghost_text(buf)
    return text and #text >= 8 and text
  end)
  note("second ghost: " .. out.second_ghost)
  sleep(300) -- 8 x's may still be the last partial: let the generation finish, so the server remembers it

  -- Typing the suggestion's first character leaves the rest; the server answers that from its last suggestion.
  local typed_through = out.status.requests.typed_through
  vim.api.nvim_input("x")
  wait_for("the typed character", 10000, function()
    return vim.api.nvim_get_current_line() == out.line_after .. "x"
  end)
  out.ghost_right_after_typing = ghost_text(buf) or vim.NIL
  wait_for("the server's typed-through answer", 20000, function()
    return status(buf).requests.typed_through > typed_through
  end)
  sleep(300) -- the response is drawn after the status reply at the latest
  out.ghost_after_typing = ghost_text(buf) or vim.NIL
  note("typed through: " .. tostring(out.ghost_after_typing))

  vim.api.nvim_input("<C-]>")
  wait_for("the dismissed ghost text to disappear", 10000, function() return not any_ghost(buf) end)
  sleep(1000) -- far longer than the debounce: a dismissed suggestion stays away until the next keystroke
  out.ghost_after_dismiss = any_ghost(buf)
  out.line_after_dismiss = vim.api.nvim_get_current_line()
  note("dismissed")

  -- Part 2, without timing luck: the client holds the inline completion requests and the driver answers
  -- them, late or out of order.
  local held, cancelled = {}, {}
  local real_request, real_cancel = client.request, client.cancel_request
  client.request = function(self, method, params, handler, bufnr)
    if method ~= "textDocument/inlineCompletion" then
      return real_request(self, method, params, handler, bufnr)
    end
    table.insert(held, { id = 100000 + #held, params = params, handler = handler })
    return true, held[#held].id
  end
  client.cancel_request = function(self, id)
    if id >= 100000 then
      table.insert(cancelled, id)
      return true
    end
    return real_cancel(self, id)
  end
  local function partial(req, text)
    client.handlers["memosight/partialCompletion"](nil, { id = req.id, uri = req.params.textDocument.uri,
      position = req.params.position, text = text }, { client_id = client.id, method = "memosight/partialCompletion" })
  end
  local function respond(req, items)
    req.handler(nil, { items = items }, { client_id = client.id, bufnr = buf, method = "textDocument/inlineCompletion" })
  end

  vim.api.nvim_input("a")
  wait_for("request 1", 10000, function() return #held == 1 end)
  vim.api.nvim_input("b")
  wait_for("request 2", 10000, function() return #held == 2 end)
  out.cancelled = vim.deepcopy(cancelled) -- request 1, once request 2 was sent
  out.request_ids = { held[1].id, held[2].id }
  partial(held[1], "zz")
  out.ghost_from_stale_partial = any_ghost(buf)
  partial(held[2], "yy")
  out.ghost_from_partial = ghost_text(buf) or vim.NIL
  respond(held[1], { { insertText = "STALE" } })
  out.ghost_after_stale_response = ghost_text(buf) or vim.NIL
  respond(held[2], { { insertText = "one\n  two", command = { title = "Accept", command = "memosight.accepted",
                                                               arguments = { 8 } } } })
  out.multiline_ghost = ghost_text(buf) or vim.NIL
  out.line_before_multiline = vim.api.nvim_get_current_line()
  vim.api.nvim_input("<Tab>")
  wait_for("the multi-line insertion", 10000, function()
    return vim.api.nvim_buf_line_count(buf) > 3
  end)
  out.lines_after_multiline = vim.api.nvim_buf_get_lines(buf, 0, -1, true)
  out.cursor_after_multiline = vim.api.nvim_win_get_cursor(0)
  wait_for("the request after accepting", 10000, function() return #held == 3 end)

  -- A response for the latest request is dropped when the user typed after it was sent.
  local extmark = require("memosight.extmark")
  extmark.debounce_ms = 3000
  vim.api.nvim_input("c")
  wait_for("the typed c", 10000, function() return vim.api.nvim_get_current_line():sub(-1) == "c" end)
  respond(held[3], { { insertText = "LATE" } })
  out.ghost_after_late_response = any_ghost(buf)
  extmark.debounce_ms = 50
  vim.api.nvim_input("d")
  wait_for("request 4", 10000, function() return #held == 4 end)
  respond(held[4], { { insertText = "E" } })
  out.ghost_before_esc = ghost_text(buf) or vim.NIL

  -- <Tab> pressed on streamed text just as the answer arrives: the edit, scheduled by the mapping, runs
  -- after the answer replaced the text, and still inserts (what is on screen then).
  vim.api.nvim_input("e")
  wait_for("request 5", 10000, function() return #held == 5 end)
  partial(held[5], "F")
  out.ghost_streamed_before_tab = ghost_text(buf) or vim.NIL
  out.tab_took_it = extmark.accept(buf) -- what the <Tab> mapping calls; the insertion is scheduled
  respond(held[5], { { insertText = "FG", command = { title = "Accept", command = "memosight.accepted",
                                                      arguments = { 2 } } } })
  out.line_after_racing_tab = wait_for("the insertion racing the answer", 10000, function()
    local line = vim.api.nvim_get_current_line()
    return line:sub(-2) == "FG" and line
  end)
  client.request, client.cancel_request = nil, nil -- back to the class's methods

  -- Leaving insert mode clears the ghost text.
  vim.api.nvim_input("<Esc>")
  wait_for("normal mode", 5000, function() return vim.api.nvim_get_mode().mode == "n" end)
  out.ghost_in_normal_mode = any_ghost(buf)
  out.final_status = status_once_accepted(buf, 3)

  stop_server(client)
end)
"""


def test_extmark_backend_streams_shows_accepts_types_through_and_dismisses(headless_nvim, repeater_model_dir):
    started = time.monotonic()
    out = headless_nvim.run(DRIVER_LUA, repeater_model_dir, setup='backend = "extmark",', show=("partials",))

    suggestion = "x" * headless_nvim.max_new_tokens  # the repeater model emits "x" until max_new_tokens
    assert out["backend"] == "extmark"
    assert not out["native_enabled"]  # only one backend draws
    assert out["asked_for_partials"] is True

    # streaming: partial texts arrived while generating and were drawn at the cursor as they came
    partials = out["partials"][:out["partials_before_final"]]  # those of the first suggestion
    assert partials, out["partials"]
    assert all(set(p["text"]) == {"x"} for p in partials), partials
    drawn = [p for p in partials if p["drawn"] == p["text"]]
    assert drawn, partials
    assert [len(p["text"]) for p in drawn] == sorted(len(p["text"]) for p in drawn)  # growing

    assert out["ghost"] == suggestion
    assert out["virt_text_pos"] == "inline"
    assert out["hl_group"] == "MemoSightSuggestion"
    assert out["line_before"] == "    return "
    assert out["line_after"] == "    return " + suggestion
    assert out["cursor"] == [3, len("    return " + suggestion)]  # the cursor ends after the insertion
    assert out["mode_after_accept"] == "i"
    requests = out["status"]["requests"]
    assert requests["accepted"] == 1
    assert requests["accepted_chars"] == len(suggestion)

    assert out["second_ghost"] == suggestion
    assert out["ghost_right_after_typing"] == suggestion[1:]  # kept (not flickering) until the answer
    assert out["ghost_after_typing"] == suggestion[1:]
    assert not out["ghost_after_dismiss"]
    assert out["line_after_dismiss"] == "    return " + suggestion + "x"  # dismissing inserts nothing

    # held requests: the older one is cancelled when the newer one is sent; its partials and response are dropped
    assert out["cancelled"] == out["request_ids"][:1]
    assert not out["ghost_from_stale_partial"]
    assert out["ghost_from_partial"] == "yy"
    assert out["ghost_after_stale_response"] == "yy"
    assert out["multiline_ghost"] == "one\n  two"  # first line inline, the rest as virt_lines
    line = out["line_before_multiline"]
    assert out["lines_after_multiline"][2:] == [line + "one", "  two"]
    assert out["cursor_after_multiline"] == [4, len("  two")]
    assert not out["ghost_after_late_response"]  # typed after the request: dropped
    assert out["ghost_before_esc"] == "E"
    assert out["ghost_streamed_before_tab"] == "F"
    assert out["tab_took_it"] is True
    assert out["line_after_racing_tab"].endswith("eFG")
    assert not out["ghost_in_normal_mode"]
    final = out["final_status"]["requests"]
    assert final["accepted"] == 3  # the multi-line item's and the racing item's commands went to the server
    assert final["accepted_chars"] == len(suggestion) + 8 + 2
    print(f"nvim extmark end-to-end: {time.monotonic() - started:.1f} s; {len(partials)} partials before the first final; "
          f"{out['events']}")


SELECTION_LUA = r"""
vim.opt.rtp:prepend(os.getenv("MEMOSIGHT_PLUGIN_DIR"))
local m = require("memosight")
local out = { notes = {} }
vim.notify_once = function(msg) table.insert(out.notes, msg) end
local opts = { filetypes = { "no-such-filetype" } } -- no server is started
m.setup(opts)
out.auto = m.backend()
m.setup(vim.tbl_extend("force", opts, { backend = "extmark" }))
out.extmark = m.backend()
vim.lsp.inline_completion = false -- as on Neovim 0.10-0.11 (nil would load the module again)
m.setup(opts)
out.auto_without_native = m.backend()
m.setup(vim.tbl_extend("force", opts, { backend = "native" }))
out.native_without_native = m.backend()
out.capabilities = require("memosight.extmark").capabilities()
io.stdout:write(vim.json.encode(out))
"""


def test_backend_selection(tmp_path, headless_nvim):
    script = tmp_path / "selection.lua"
    script.write_text(SELECTION_LUA)
    env = headless_nvim.env()
    proc = subprocess.run([headless_nvim.binary, "--headless", "--clean", "-i", "NONE", "-l", str(script)], env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["auto"] == "native"  # this Neovim (0.12) has vim.lsp.inline_completion
    assert out["extmark"] == "extmark"
    assert out["auto_without_native"] == "extmark"
    assert out["native_without_native"] == "extmark"
    assert any("needs Neovim 0.12" in note for note in out["notes"])
    caps = out["capabilities"]
    assert caps["experimental"]["memosight"]["partialCompletion"] is True
    assert caps["textDocument"]["synchronization"]  # the defaults are kept
