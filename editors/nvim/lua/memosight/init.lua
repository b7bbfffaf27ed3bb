--- MemoSight for Neovim: starts `memosight-lsp --stdio` for the configured filetypes and shows its
--- inline completions as ghost text: with Neovim's native `vim.lsp.inline_completion` (0.12+), or with
--- the plugin's own extmark backend (0.10-0.11, or `backend = "extmark"`), which also streams the text
--- while the server generates it.
---
---   require("memosight").setup({ settings = { max_new_tokens = 32 } })

local M = {}

local NAME = "memosight"
local STATUS_METHOD = "memosight/status"
local VISITED_METHOD = "memosight/visited"

M.defaults = {
  -- The language server command; any `memosight-lsp` on $PATH, or e.g. { "/venv/bin/python", "-m", "memosight.server", "--stdio" }.
  cmd = { "memosight-lsp", "--stdio" },
  -- Filetypes for which the server is started.
  filetypes = {
    "python", "javascript", "javascriptreact", "typescript", "typescriptreact", "go", "rust", "lua",
    "c", "cpp", "java", "sh", "bash", "zsh", "ruby", "php", "kotlin", "scala", "swift", "cs",
  },
  -- The workspace root is the nearest folder holding one of these (the server reads .memosight.toml there).
  root_markers = { ".memosight.toml", "pyproject.toml", ".git" },
  -- Server settings (keys of .memosight.toml: model, max_new_tokens, multiline, device, ...). They are sent as
  -- initializationOptions and answered to workspace/configuration (section "memosight"), so they override the file.
  settings = {},
  -- Ghost text: "auto" (native on 0.12+, else extmark), "native" (vim.lsp.inline_completion, 0.12+) or
  -- "extmark" (the plugin's own requests and extmarks; shows partial text while the server generates).
  backend = "auto",
  -- extmark backend: milliseconds without typing before a completion is requested.
  debounce_ms = 50,
  -- Insert-mode keys; set one to false to leave that key alone. `accept` and `dismiss` fall back to the key's
  -- ordinary meaning when no suggestion is shown.
  keymaps = {
    accept = "<Tab>",
    next = "<M-]>",
    prev = "<M-[>",
    dismiss = "<C-]>",
  },
}

M.config = vim.deepcopy(M.defaults)

---@return vim.lsp.Client?
local function client_for(bufnr)
  return vim.lsp.get_clients({ bufnr = bufnr, name = NAME })[1] or vim.lsp.get_clients({ name = NAME })[1]
end

-- Ghost text: a backend is { enable(bufnr), shown(bufnr) -> boolean, accept(bufnr), select(bufnr, count),
-- dismiss(bufnr) }. Neovim 0.12 draws and accepts the server's items itself, and on acceptance it executes the
-- item's `command` (memosight.accepted) with client:exec_cmd, which is how the server counts acceptances.
-- The extmark backend (extmark.lua) serves 0.10-0.11 and `backend = "extmark"`.
local native = {}

-- Neovim 0.12 has no public "dismiss" or "is a suggestion shown?"; the per-buffer completor is internal.
local function completor(bufnr)
  return vim.tbl_get(vim.lsp, "_capability", "all", "inline_completion", "active", bufnr)
end

function native.enable(bufnr)
  vim.lsp.inline_completion.enable(true, { bufnr = bufnr })
end

function native.shown(bufnr)
  local c = completor(bufnr)
  return c ~= nil and c.current ~= nil
end

function native.accept(bufnr)
  return vim.lsp.inline_completion.get({ bufnr = bufnr })
end

function native.select(bufnr, count)
  vim.lsp.inline_completion.select({ bufnr = bufnr, count = count })
end

function native.dismiss(bufnr)
  local c = completor(bufnr)
  if c and c.reset_timer then
    c:reset_timer() -- else a debounced request still pending would bring the suggestion back
  end
  if c and c.abort then
    c:abort()
  end
end

local ghost -- the backend, chosen by setup()

local function pick_backend(choice)
  local has_native = vim.lsp.inline_completion and true or false
  if choice == "native" and not has_native then
    vim.notify_once("MemoSight: backend = \"native\" needs Neovim 0.12 (vim.lsp.inline_completion); "
      .. "using the extmark backend", vim.log.levels.WARN)
  elseif choice ~= "auto" and choice ~= "native" and choice ~= "extmark" then
    vim.notify_once("MemoSight: unknown backend " .. vim.inspect(choice) .. " (auto, native or extmark)",
      vim.log.levels.WARN)
    choice = "auto"
  end
  if has_native and choice ~= "extmark" then
    return native
  end
  local extmark = require("memosight.extmark")
  extmark.debounce_ms = M.config.debounce_ms
  extmark.client_name = NAME
  return extmark
end

local function set_keymaps(bufnr)
  local keys = M.config.keymaps
  local function map(lhs, rhs, desc)
    if lhs then
      vim.keymap.set("i", lhs, rhs, { buffer = bufnr, expr = true, silent = true, desc = "MemoSight: " .. desc })
    end
  end
  map(keys.accept, function()
    if not ghost.shown(bufnr) then
      return keys.accept
    end
    ghost.accept(bufnr)
    return ""
  end, "accept suggestion")
  map(keys.dismiss, function()
    if not ghost.shown(bufnr) then
      return keys.dismiss
    end
    ghost.dismiss(bufnr)
    return ""
  end, "dismiss suggestion")
  map(keys.next, function()
    ghost.select(bufnr, 1)
    return ""
  end, "next suggestion")
  map(keys.prev, function()
    ghost.select(bufnr, -1)
    return ""
  end, "previous suggestion")
end

-- Where the user yanked code or was when they left the buffer: the server keeps it as recent code,
-- context for completions in other files (as llama.vim gathers chunks on yank and on leaving a buffer).
local function report_visits(client, bufnr)
  local group = vim.api.nvim_create_augroup("memosight.visits", { clear = false })
  vim.api.nvim_clear_autocmds({ group = group, buffer = bufnr })
  local function send(line, entered)
    if client:is_stopped() then
      return
    end
    require("memosight.extmark").call(client, "notify", VISITED_METHOD,
      { textDocument = { uri = vim.uri_from_bufnr(bufnr) }, line = line, entered = entered or nil })
  end
  -- Entering the buffer (and attaching to the one on screen): the server prefills the prompt at the
  -- cursor's line while the user reads, so the first keystroke is answered sooner.
  local function entered()
    if vim.api.nvim_get_current_buf() == bufnr then
      send(vim.api.nvim_win_get_cursor(0)[1] - 1, true)
    end
  end
  vim.api.nvim_create_autocmd("BufEnter", { group = group, buffer = bufnr, callback = entered })
  vim.schedule(entered)
  vim.api.nvim_create_autocmd("TextYankPost", {
    group = group,
    buffer = bufnr,
    callback = function()
      local row = vim.api.nvim_buf_get_mark(bufnr, "[")[1]
      if vim.v.event.operator == "y" and row > 0 then -- a delete or change is an edit: the server saw it
        send(row - 1)
      end
    end,
  })
  vim.api.nvim_create_autocmd("BufLeave", {
    group = group,
    buffer = bufnr,
    callback = function()
      send(vim.api.nvim_win_get_cursor(0)[1] - 1)
    end,
  })
end

local function on_attach(client, bufnr)
  if vim.fn.has("nvim-0.10") == 0 then
    vim.notify_once("MemoSight: ghost text needs Neovim 0.10 or newer", vim.log.levels.WARN)
    return
  end
  ghost.enable(bufnr)
  set_keymaps(bufnr)
  report_visits(client, bufnr)
end

--- Whether the user has `:trust`ed this project's .memosight.toml as it is now (Neovim's own trust
--- database, read without prompting). Only then may the project's file send code to a server.
local function trusted(root)
  local file = root and vim.uv.fs_realpath(root .. "/.memosight.toml")
  local handle = file and io.open(file, "rb")
  if not handle then
    return false
  end
  local hash = vim.fn.sha256(handle:read("*a"))
  handle:close()
  local ok, lines = pcall(vim.fn.readfile, vim.fn.stdpath("state") .. "/trust")
  for _, line in ipairs(ok and lines or {}) do
    local h, path = line:match("^(%S+) (.+)$")
    if path == file and h == hash then
      return true
    end
  end
  return false
end

local function start(bufnr)
  if vim.bo[bufnr].buftype ~= "" then
    return
  end
  local root = vim.fs.root(bufnr, M.config.root_markers)
  local settings = vim.tbl_extend("force", M.config.settings, { trustedWorkspace = trusted(root) })
  local config = {
    name = NAME,
    cmd = M.config.cmd,
    root_dir = root,
    init_options = { memosight = settings },
    settings = { memosight = settings },
    on_attach = on_attach,
  }
  if ghost ~= native then -- the extmark backend asks for partial results and draws them
    local extmark = require("memosight.extmark")
    config.capabilities = extmark.capabilities()
    config.handlers = { [extmark.PARTIAL_METHOD] = extmark.on_partial }
  end
  vim.lsp.start(config, { bufnr = bufnr })
end

--- The ghost-text backend in use: "native" or "extmark" (nil before setup).
function M.backend()
  return ghost and (ghost == native and "native" or "extmark") or nil
end

--- Ask the server for `memosight/status` (model, device, request counters, cache) and pass it to `callback`.
---@param callback fun(err: table?, result: table?)
---@param bufnr integer?
function M.status(callback, bufnr)
  local client = client_for(bufnr or vim.api.nvim_get_current_buf())
  if not client then
    callback({ message = "MemoSight is not running for this buffer" }, nil)
    return
  end
  require("memosight.extmark").call(client, "request", STATUS_METHOD, vim.empty_dict(), function(err, result)
    callback(err, result)
  end, bufnr)
end

local function show_status()
  M.status(function(err, result)
    if err then
      vim.notify("MemoSight: " .. (err.message or vim.inspect(err)), vim.log.levels.ERROR)
    else
      local without_nulls = vim.inspect(result, {
        process = function(item)
          if item ~= vim.NIL then
            return item
          end
        end,
      })
      vim.notify("MemoSight status\n" .. without_nulls, vim.log.levels.INFO)
    end
  end)
end

function M.setup(opts)
  opts = opts or {}
  M.config = vim.tbl_deep_extend("force", vim.deepcopy(M.defaults), opts)
  for _, list in ipairs({ "cmd", "filetypes", "root_markers" }) do
    M.config[list] = opts[list] or M.config[list] -- a list replaces the default instead of merging index by index
  end
  ghost = pick_backend(M.config.backend)

  local group = vim.api.nvim_create_augroup("memosight", { clear = true })
  vim.api.nvim_create_autocmd("FileType", {
    group = group,
    pattern = M.config.filetypes,
    callback = function(args)
      start(args.buf)
    end,
  })
  vim.api.nvim_create_user_command("MemoSightStatus", show_status, { desc = "Show the MemoSight server's status" })

  -- setup() may run after buffers were opened (lazy loading)
  for _, bufnr in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(bufnr) and vim.tbl_contains(M.config.filetypes, vim.bo[bufnr].filetype) then
      start(bufnr)
    end
  end
end

return M
