--- The ghost-text backend for Neovim 0.10-0.11 (and for 0.12 with `backend = "extmark"`): it sends
--- `textDocument/inlineCompletion` itself while typing (debounced; a newer request cancels the older one)
--- and draws the suggestion with extmarks: the first line as inline virtual text at the cursor, the
--- others as virtual lines below. While the server generates, its `memosight/partialCompletion`
--- notifications show the text so far; the final response replaces it.
---
--- Same interface as the native backend in init.lua: enable, shown, accept, select, dismiss.

local api = vim.api

local M = {}

M.PARTIAL_METHOD = "memosight/partialCompletion"
M.ACCEPTED_COMMAND = "memosight.accepted"
M.HL_GROUP = "MemoSightSuggestion"
M.namespace = api.nvim_create_namespace("memosight.ghost")
M.debounce_ms = 50
M.client_name = "memosight"

local INLINE_COMPLETION = "textDocument/inlineCompletion"
local TRIGGER_AUTOMATIC = 2 -- lsp.InlineCompletionTriggerKind.Automatic
local has_011 = vim.fn.has("nvim-0.11") == 1

--- client:method(...) on 0.11+, client.method(...) on 0.10.
local function call(client, method, ...)
  if has_011 then
    return client[method](client, ...)
  end
  return client[method](...)
end
M.call = call -- init.lua's requests and notifications go through it too

--- The client capabilities to start the server with: the defaults, plus inline completion and the opt-in
--- to partial results (the server streams only to clients that ask).
function M.capabilities()
  return vim.tbl_deep_extend("force", vim.lsp.protocol.make_client_capabilities(), {
    textDocument = { inlineCompletion = { dynamicRegistration = false } },
    experimental = { memosight = { partialCompletion = true } },
  })
end

-- Per buffer:
--   key      "changedtick:row:col" of the last event handled; an event at the same place does nothing, so
--            a dismissed suggestion stays away until the next keystroke or cursor move
--   seq      number of the latest request; the responses of older ones are dropped
--   timer    the debounce timer
--   pending  { seq, id, client_id, tick, row, col, params } of the request in flight
--   shown    { text, command, client_id, tick, row, col, partial } of the drawn suggestion
--   items, index, client_id   the items of the last response, for select()
local states = {}

local function state(bufnr)
  local s = states[bufnr]
  if not s then
    s = { seq = 0 }
    states[bufnr] = s
  end
  return s
end

--- Where the user is, when `bufnr` is the current buffer in insert mode; else nil.
local function here(bufnr)
  if api.nvim_get_current_buf() ~= bufnr or api.nvim_get_mode().mode:sub(1, 1) ~= "i" then
    return nil
  end
  local row, col = unpack(api.nvim_win_get_cursor(0))
  local tick = api.nvim_buf_get_changedtick(bufnr)
  return { tick = tick, row = row - 1, col = col, key = tick .. ":" .. row .. ":" .. col }
end

local function same_place(a, b)
  return a ~= nil and b ~= nil and a.tick == b.tick and a.row == b.row and a.col == b.col
end

local function get_client(bufnr)
  return vim.lsp.get_clients({ bufnr = bufnr, name = M.client_name })[1]
end

local function accepted_command(text)
  return { title = "Accept", command = M.ACCEPTED_COMMAND, arguments = { vim.fn.strchars(text) } }
end

local function hide(bufnr)
  if api.nvim_buf_is_valid(bufnr) then
    api.nvim_buf_clear_namespace(bufnr, M.namespace, 0, -1)
  end
  local s = states[bufnr]
  if s then
    s.shown = nil
  end
end

--- Draws `shown.text` at (shown.row, shown.col) and remembers it as the buffer's suggestion.
local function draw(bufnr, shown)
  api.nvim_buf_clear_namespace(bufnr, M.namespace, 0, -1)
  state(bufnr).shown = shown
  local tab = string.rep(" ", vim.bo[bufnr].tabstop)
  local function chunks(line)
    return { { (line:gsub("\t", tab)), M.HL_GROUP } }
  end
  local lines = vim.split(shown.text, "\n", { plain = true })
  local virt_lines = {}
  for i = 2, #lines do
    virt_lines[#virt_lines + 1] = chunks(lines[i])
  end
  api.nvim_buf_set_extmark(bufnr, M.namespace, shown.row, shown.col, {
    virt_text = lines[1] ~= "" and chunks(lines[1]) or nil,
    virt_text_pos = lines[1] ~= "" and "inline" or nil,
    virt_lines = #virt_lines > 0 and virt_lines or nil,
    hl_mode = "combine",
  })
end

local function cancel(pending)
  local client = pending and vim.lsp.get_client_by_id(pending.client_id)
  if client and not client:is_stopped() then
    pcall(call, client, "cancel_request", pending.id)
  end
end

local function item_text(item)
  local text = type(item) == "table" and item.insertText
  if type(text) == "table" then
    text = text.value -- a snippet (StringValue); MemoSight sends plain text
  end
  return type(text) == "string" and text or nil
end

local function show_item(bufnr, at)
  local s = state(bufnr)
  local item = s.items[s.index]
  local text = item_text(item)
  if not text or text == "" then
    hide(bufnr)
    return
  end
  -- MemoSight's items have no range: the text goes in at the cursor.
  draw(bufnr, { text = text, command = item.command, client_id = s.client_id, tick = at.tick, row = at.row,
                col = at.col })
end

local function on_response(bufnr, seq, err, result)
  local s = states[bufnr]
  if not s or seq ~= s.seq then
    return -- a newer request was sent
  end
  local pending = s.pending
  s.pending = nil
  local at = here(bufnr)
  if err or not pending or not same_place(at, pending) then
    return -- failed, or the user typed or moved since it was sent
  end
  local items = type(result) == "table" and (result.items or result) or {}
  if type(items) ~= "table" or #items == 0 then
    hide(bufnr)
    return
  end
  s.items, s.index, s.client_id = items, 1, pending.client_id
  show_item(bufnr, at)
end

local function request(bufnr)
  local s = states[bufnr]
  local at = here(bufnr)
  local client = get_client(bufnr)
  if not (s and at and client) or not client.server_capabilities.inlineCompletionProvider then
    return
  end
  s.key = at.key
  local params = vim.lsp.util.make_position_params(0, client.offset_encoding)
  params.context = { triggerKind = TRIGGER_AUTOMATIC }
  s.seq = s.seq + 1
  local seq = s.seq
  local ok, id = call(client, "request", INLINE_COMPLETION, params, function(err, result)
    on_response(bufnr, seq, err, result)
  end, bufnr)
  local previous = s.pending
  s.pending = ok and { seq = seq, id = id, client_id = client.id, tick = at.tick, row = at.row, col = at.col,
                       params = params } or nil
  -- Cancelled after the new one is sent: the server lets a request join the previous one's generation when
  -- the user only typed more of its text, and a cancel that came first would have stopped that generation.
  cancel(previous)
end

--- The rest of the shown suggestion when the user typed its beginning, shown until the server's answer.
local function typed_through(bufnr, shown, at)
  if at.row ~= shown.row or at.col <= shown.col then
    return nil
  end
  local line = api.nvim_buf_get_lines(bufnr, at.row, at.row + 1, true)[1]
  local typed = line:sub(shown.col + 1, at.col)
  if #typed < #shown.text and shown.text:sub(1, #typed) == typed then
    return shown.text:sub(#typed + 1)
  end
  return nil
end

local function arm_timer(bufnr, s)
  if not s.timer then
    s.timer = vim.uv.new_timer()
  end
  s.timer:stop()
  s.timer:start(M.debounce_ms, 0, vim.schedule_wrap(function()
    if states[bufnr] == s then
      request(bufnr)
    end
  end))
end

local function on_event(bufnr, event)
  local s = state(bufnr)
  local at = here(bufnr)
  if not at then
    if event == "InsertEnter" then -- the mode may not say "insert" yet while InsertEnter runs
      arm_timer(bufnr, s)
    end
    return
  end
  if at.key == s.key then
    return
  end
  s.key = at.key
  local shown = s.shown
  if shown and not same_place(shown, at) then
    local rest = typed_through(bufnr, shown, at)
    if rest then
      draw(bufnr, { text = rest, command = accepted_command(rest), client_id = shown.client_id, tick = at.tick,
                    row = at.row, col = at.col, partial = shown.partial })
    else
      hide(bufnr)
    end
  end
  arm_timer(bufnr, s)
end

--- Forget the buffer's suggestion and request; `drop` also forgets where the last event was.
local function reset(bufnr, drop)
  local s = states[bufnr]
  if not s then
    return
  end
  if s.timer then
    s.timer:stop()
  end
  cancel(s.pending)
  s.pending = nil
  s.seq = s.seq + 1
  hide(bufnr)
  if drop then
    s.key = nil
  end
end

--- Handler of `memosight/partialCompletion` {id, uri, position, text}: the text generated so far for a
--- request; drawn when that request is the buffer's latest and the user has not typed or moved since.
function M.on_partial(err, params, ctx)
  if err or type(params) ~= "table" or type(params.text) ~= "string" then
    return
  end
  for bufnr, s in pairs(states) do
    local p = s.pending
    if p and p.id == params.id and (not ctx or ctx.client_id == nil or ctx.client_id == p.client_id)
        and p.params.textDocument.uri == params.uri and type(params.position) == "table"
        and p.params.position.line == params.position.line
        and p.params.position.character == params.position.character then
      local at = here(bufnr)
      local shown = s.shown
      local longer = shown and same_place(shown, at) and #shown.text > #params.text
        and shown.text:sub(1, #params.text) == params.text -- the rest of a suggestion the user typed into
      if same_place(at, p) and params.text ~= "" and not longer then
        draw(bufnr, { text = params.text, command = accepted_command(params.text), client_id = p.client_id,
                      tick = at.tick, row = at.row, col = at.col, partial = true })
      end
      return
    end
  end
end

local function set_highlight()
  api.nvim_set_hl(0, M.HL_GROUP, { link = "Comment", default = true })
end

function M.enable(bufnr)
  set_highlight()
  local group = api.nvim_create_augroup("memosight.ghost", { clear = false })
  api.nvim_clear_autocmds({ group = group, buffer = bufnr })
  api.nvim_create_autocmd({ "InsertEnter", "TextChangedI", "TextChangedP", "CursorMovedI" }, {
    group = group,
    buffer = bufnr,
    callback = function(args)
      on_event(bufnr, args.event)
    end,
  })
  api.nvim_create_autocmd({ "InsertLeave", "BufLeave" }, {
    group = group,
    buffer = bufnr,
    callback = function()
      reset(bufnr, true)
    end,
  })
  api.nvim_create_autocmd({ "BufUnload", "LspDetach" }, {
    group = group,
    buffer = bufnr,
    callback = function(args)
      if args.event == "LspDetach" then
        local client = vim.lsp.get_client_by_id(args.data and args.data.client_id or -1)
        if not client or client.name ~= M.client_name then
          return
        end
      end
      reset(bufnr, true)
      local s = states[bufnr]
      if s and s.timer and not s.timer:is_closing() then
        s.timer:close()
      end
      states[bufnr] = nil
      pcall(api.nvim_clear_autocmds, { group = group, buffer = bufnr })
    end,
  })
  if not M._colorscheme then
    M._colorscheme = api.nvim_create_autocmd("ColorScheme", { callback = set_highlight })
  end
  state(bufnr)
  on_event(bufnr) -- already in insert mode (the server attached while typing)
end

function M.shown(bufnr)
  local s = states[bufnr]
  return s ~= nil and s.shown ~= nil and same_place(here(bufnr), s.shown)
end

--- Inserts the shown suggestion at the cursor and runs its command (memosight.accepted). Called from an
--- <expr> mapping, where the text is locked, so the edit runs right after it.
function M.accept(bufnr)
  local s = states[bufnr]
  local shown = s and s.shown
  if not shown then
    return false
  end
  vim.schedule(function()
    -- The server's answer may have replaced the streamed text between the key and this edit: insert what
    -- is on screen now, so a <Tab> pressed as the answer arrives is never lost.
    shown = s.shown
    if not shown or not same_place(here(bufnr), shown) then
      return
    end
    reset(bufnr, false)
    local lines = vim.split(shown.text, "\n", { plain = true })
    api.nvim_buf_set_text(bufnr, shown.row, shown.col, shown.row, shown.col, lines)
    local last = lines[#lines]
    api.nvim_win_set_cursor(0, { shown.row + #lines, (#lines == 1 and shown.col or 0) + #last })
    local client = vim.lsp.get_client_by_id(shown.client_id)
    if shown.command and client and not client:is_stopped() then
      if client.exec_cmd and has_011 then
        client:exec_cmd(shown.command, { bufnr = bufnr })
      else
        call(client, "request", "workspace/executeCommand",
          { command = shown.command.command, arguments = shown.command.arguments }, function() end, bufnr)
      end
    end
  end)
  return true
end

--- Shows the next (count 1) or previous (count -1) item of the last response, if it had several.
function M.select(bufnr, count)
  local s = states[bufnr]
  local at = here(bufnr)
  if not (s and s.items and #s.items > 1 and s.shown and not s.shown.partial and same_place(at, s.shown)) then
    return
  end
  s.index = (s.index - 1 + (count or 1)) % #s.items + 1
  show_item(bufnr, at)
end

--- Hides the suggestion and cancels the request in flight; it stays away until the next keystroke.
function M.dismiss(bufnr)
  reset(bufnr, false)
end

return M
