"""The language server: handlers only, each a few lines that call documents, config, suggest.

The wire (JSON-RPC, framing) is rpc.py's and framing.py's; this module speaks LSP's methods."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

import attrs
from lsprotocol import types

from . import __version__
from .config import ConfigError, ConfigSources, Settings, validate
from .context.workspace import WorkspaceIndex
from .documents import Document, DocumentStore, Position, file_path
from .editor_log import EditorLog
from .model_offer import ModelOffer, stand_in
from .request.engine_choice import Load
from .request.records import Ticket
from .request.suggest import Suggester, Suggestion
from .request.timeline import Timelines
from .rpc.connection import (
    CONTENT_MODIFIED,
    INVALID_PARAMS,
    Connection,
    RequestError,
    current_request_id,
)
from .status import StatusParams, status_answer

log = logging.getLogger(__name__)

STATUS_METHOD = "memosight/status"
# A client notification: the user looked at or yanked code ({"textDocument": {"uri"}, "line"}), which
# becomes recent code for the context of other files (llama.vim's ring gathers the same on yank and
# on leaving a buffer).
VISITED_METHOD = "memosight/visited"
PARTIAL_METHOD = "memosight/partialCompletion"
ACCEPTED_COMMAND = "memosight.accepted"
CONFIG_SECTION = "memosight"


@attrs.define
class VisitedParams:
    """memosight/visited: {"textDocument": {"uri"}, "line": N >= 0, "entered": bool}."""

    text_document: types.TextDocumentIdentifier
    line: int = attrs.field(validator=attrs.validators.ge(0))
    entered: bool = False  # the user opened or switched to the file (else: looked at or yanked the line)


POPUPS_PER_MINUTE = 5  # more in a minute go to the log only: a misbehaving client cannot flood the user
CAPABILITIES = types.ServerCapabilities(
    position_encoding=types.PositionEncodingKind.Utf16,
    text_document_sync=types.TextDocumentSyncOptions(open_close=True, change=types.TextDocumentSyncKind.Incremental,
                                                     save=True),
    inline_completion_provider=types.InlineCompletionOptions(),
    completion_provider=types.CompletionOptions(trigger_characters=[".", "(", " "]),
    execute_command_provider=types.ExecuteCommandOptions(commands=[ACCEPTED_COMMAND]))


class MemoSightServer:
    def __init__(self, load_engine: Load | None = None):
        self.client_capabilities = types.ClientCapabilities()  # the client's, from initialize
        self.documents = DocumentStore()
        self.config = ConfigSources()
        self.workspace_index: WorkspaceIndex | None = None  # set up at initialize, once the root is known
        # a backend that fails is said as soon as the engine knows (the suggester says it once an hour)
        self.suggester = Suggester(load_engine, open_documents=self.documents.recent,
                                   workspace=lambda: self.workspace_index, say=self.say_now)
        self.timelines = Timelines(self.suggester.record_timeline)  # where each completion's ms went
        self.connection = Connection(on_answered=self.timelines.answered, on_error=self.report_server_error,
                                     on_dropped=self.report_dropped)
        self.editor_log = EditorLog(self.connection)  # window/logMessage, $/progress, $/logTrace
        # a catalog model that is not downloaded: offered, pulled, then loaded by applying the settings again
        self.model_offer = ModelOffer(self.connection, self.editor_log, self.report, self.apply_settings)
        self.initialized = False  # the client may be sent requests (a progress bar's token) from then on
        self._loading: object = None  # the engine load a progress bar was shown for
        self._reported: set[str] = set()  # messages already shown, so a bad file is reported once
        self._popup_times: list[float] = []
        self.log_level = logging.getLogger("memosight").level  # the command line's; a setting overrides it

    @property
    def settings(self) -> Settings:
        # a catalog model not downloaded yet: the embedded one runs until its file is there
        return stand_in(self.config.settings())

    def report(self, message: str, kind: types.MessageType = types.MessageType.Warning, again: bool = False) -> None:
        """Log `message` and show it to the user, once (`again`: as often as the caller asks; it
        limits itself), and never more than POPUPS_PER_MINUTE a minute."""
        log.warning(message)
        if message in self._reported and not again:
            return
        now = time.monotonic()
        self._popup_times = [t for t in self._popup_times if now - t < 60]
        if len(self._popup_times) >= POPUPS_PER_MINUTE:
            return  # not shown, so not remembered as shown: it may come again later and be seen
        if len(self._reported) > 1000:  # distinct messages without end: remember the recent ones only
            self._reported.clear()
        self._reported.add(message)
        self._popup_times.append(now)
        self.connection.notify(types.WINDOW_SHOW_MESSAGE, types.ShowMessageParams(type=kind, message=message))

    def say_now(self, message: str) -> bool:
        """An error from the engine's thread, shown on the event loop; False before the client is there."""
        return self.editor_log.on_loop(self.report, f"MemoSight: {message}", types.MessageType.Error, True)

    def report_server_error(self, error: Exception, method: str) -> None:
        """A notification's handler failed: logged (rpc.py), and shown like the server's own messages."""
        self.report(f"MemoSight: internal error in {method} ({error}); see the server log", types.MessageType.Error)

    def report_dropped(self, method: str, reason: str) -> None:
        self.report(f"MemoSight: a {method} message from the editor was malformed and ignored "
                    f"({reason[:200]}). If this repeats, reload the window.")

    def report_config_errors(self, errors: list[ConfigError]) -> None:
        for error in errors:
            self.report(error.message())

    def reload_config_file_if_changed(self) -> None:
        if self.config.file_changed():
            self._reported.clear()
            self.report_config_errors(self.config.reload_file())
            self.apply_settings()

    def apply_settings(self) -> None:
        settings = self.settings
        for notice in self.config.trust_notices():
            self.report(notice)
        # a removed log_level setting goes back to --log-level of the command line
        level = settings.log_level.upper() if self.config.sets("log_level") else self.log_level
        logging.getLogger("memosight").setLevel(level)
        loading = self.suggester.ensure_engine(settings)
        if self.initialized:
            self.show_loading(loading, settings)
            self.offer_model()

    def offer_model(self) -> None:
        """The catalog model the user's settings name, offered for download if it is missing."""
        self.model_offer.consider(self.config.settings(), self.client_capabilities)

    def show_loading(self, loading, settings: Settings) -> None:
        """A progress bar in the editor while the engine loads (once per load)."""
        if loading is self._loading or loading.done():
            return
        self._loading = loading
        engine = settings.engine
        what = engine.backend.url if engine.backend.kind != "local" else (engine.model or "the embedded model")
        asyncio.get_running_loop().create_task(self.editor_log.progress("MemoSight", f"loading {what}", loading))

    def reindex(self, uri: str) -> None:
        """A workspace file changed on disk (saved, closed, or seen by the client's watcher)."""
        index = self.workspace_index
        path = file_path(uri)
        if index is not None and path is not None and index.covers(Path(path)):
            index.update(Path(path))  # removes it from the index when it is gone

    def document(self, uri: str) -> Document:
        doc = self.documents.get(uri)
        if doc is None:
            raise RequestError(INVALID_PARAMS, f"document {uri} is not open: send textDocument/didOpen first")
        return doc


def _root_path(params: types.InitializeParams) -> Path | None:
    uri = None
    if params.workspace_folders:
        uri = params.workspace_folders[0].uri
    elif params.root_uri:
        uri = params.root_uri
    if uri:
        path = file_path(uri)
        return Path(path) if path is not None else None
    return Path(params.root_path) if params.root_path else None


def _to_position(p: types.Position) -> Position:
    return Position(p.line, p.character)


def create_server(load_engine: Load | None = None) -> MemoSightServer:
    """The server, with its handlers. `load_engine(spec)` builds the engine the settings name (default:
    the in-process engine; tests pass a test double)."""
    ls = MemoSightServer(load_engine)

    @ls.connection.request(types.INITIALIZE)
    def initialize(params: types.InitializeParams) -> types.InitializeResult:
        ls.client_capabilities = params.capabilities
        ls.editor_log.start(asyncio.get_running_loop(), params.capabilities, params.trace)
        ls.config.root = _root_path(params)
        if ls.config.root is not None and ls.config.root.is_dir():
            ls.workspace_index = WorkspaceIndex(ls.config.root)
            ls.workspace_index.start()  # in the background: completions do not wait for it
        ls.report_config_errors(ls.config.reload_file())
        options = params.initialization_options
        if options is not None:
            ls.config.init_values, errors = validate(_section(options), "initializationOptions")
            ls.report_config_errors(errors)
        ls.apply_settings()
        return types.InitializeResult(capabilities=CAPABILITIES, server_info=types.ServerInfo("memosight", __version__))

    @ls.connection.notification(types.INITIALIZED)
    async def initialized(params: types.InitializedParams) -> None:
        ls.initialized = True
        await _watch_files(ls)
        await _pull_client_configuration(ls)
        ls.apply_settings()  # now the client may be asked: the load's progress bar, the model's offer

    @ls.connection.notification(types.SET_TRACE)
    def set_trace(params: types.SetTraceParams) -> None:
        ls.editor_log.trace = params.value

    @ls.connection.notification(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(params: types.DidChangeConfigurationParams) -> None:
        if params.settings and isinstance(params.settings, dict) and CONFIG_SECTION in params.settings:
            ls.config.client_values, errors = validate(params.settings[CONFIG_SECTION], "editor settings")
            ls.report_config_errors(errors)
            ls.apply_settings()
        else:
            await _pull_client_configuration(ls)

    @ls.connection.notification(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched_files(params: types.DidChangeWatchedFilesParams) -> None:
        ls.reload_config_file_if_changed()
        for change in params.changes:
            ls.reindex(change.uri)

    @ls.connection.notification(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(params: types.DidOpenTextDocumentParams) -> None:
        d = params.text_document
        if ls.documents.open(d.uri, d.text, d.language_id, d.version) is None:
            limit = ls.documents.MAX_OPEN_BYTES // 2**20
            ls.report(f"MemoSight: the open files take about {ls.documents.open_bytes() / 2**20:.0f} MB; with "
                      f"{d.uri} they would pass the {limit} MB MemoSight keeps for them. It gets no completions "
                      f"until other files are closed and it is opened again.")

    @ls.connection.notification(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(params: types.DidChangeTextDocumentParams) -> None:
        doc = ls.documents.get(params.text_document.uri)
        if doc is None:
            log.warning("didChange for %s, which is not open; ignored", params.text_document.uri)
            return
        edit = None
        for change in params.content_changes:
            if isinstance(change, types.TextDocumentContentChangePartial):
                edit = doc.apply_change(change.text, _to_position(change.range.start), _to_position(change.range.end))
            else:
                doc.apply_change(change.text)
        doc.version = params.text_document.version
        ls.documents.touch(doc.uri)
        if edit is not None:  # the cursor is most likely where the last edit ended
            ls.suggester.warm(doc, edit.new_end, ls.settings)

    @ls.connection.notification(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(params: types.DidCloseTextDocumentParams) -> None:
        ls.documents.close(params.text_document.uri)
        ls.suggester.forget(params.text_document.uri)
        ls.reindex(params.text_document.uri)  # it may have been saved with new definitions

    @ls.connection.notification(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(params: types.DidSaveTextDocumentParams) -> None:
        ls.reindex(params.text_document.uri)

    @ls.connection.notification(VISITED_METHOD, params=VisitedParams)
    def visited(params: VisitedParams) -> None:
        uri, line = params.text_document.uri, params.line
        if params.entered and (doc := ls.documents.get(uri)) is not None:
            # The user opened or switched to this file and reads it: prefill the prompt at the end
            # of their line now, so the first keystroke there prefills only what it adds. (Not
            # recent code: they have not worked there yet.)
            line = min(line, doc.line_count - 1)
            ls.suggester.warm(doc, doc.line_starts[line] + len(doc.line_text(line)), ls.settings)
        elif not ls.documents.visit(uri, line):
            log.info("%s for %s, which is not open; ignored", VISITED_METHOD, uri)

    # The completion handlers take the document as the request arrives (a plain call, before any
    # await): the messages read behind it (an edit, a close) are applied before its task runs, and
    # its answer must be true to the text the editor asked about.

    @ls.connection.request(types.TEXT_DOCUMENT_INLINE_COMPLETION)
    def inline_completion(params: types.InlineCompletionParams):
        return _inline_answer(ls, _arrived(ls, params.text_document.uri, params.position), params.position)

    @ls.connection.request(types.TEXT_DOCUMENT_COMPLETION)
    def completion(params: types.CompletionParams):
        return _completion_answer(ls, _arrived(ls, params.text_document.uri, params.position), params.position)

    @ls.connection.request(STATUS_METHOD, params=StatusParams)
    def status(params: StatusParams) -> dict:
        return status_answer(ls, params)

    @ls.connection.request(types.WORKSPACE_EXECUTE_COMMAND)
    def execute_command(params: types.ExecuteCommandParams) -> None:
        if params.command != ACCEPTED_COMMAND:
            raise RequestError(INVALID_PARAMS, f"unknown command {params.command!r}; MemoSight has {ACCEPTED_COMMAND}")
        args = params.arguments or []  # the client says how many characters were taken
        ls.suggester.record_accepted(args[0] if args and isinstance(args[0], int) and not isinstance(args[0], bool)
                                     else 0)

    @ls.connection.request(types.SHUTDOWN)
    def shutdown(params) -> None:
        ls.connection.shutting_down = True  # every later request is refused; exit ends the process
        ls.suggester.shutdown()
        ls.editor_log.stop()

    @ls.connection.notification(types.EXIT)
    def exit_now(params) -> None:
        # Leave at once: interpreter teardown with a loaded model takes seconds, and clients
        # (vscode-languageclient waits 2 s) kill a server that lingers after `exit`.
        logging.shutdown()
        os._exit(0 if ls.connection.shutting_down else 1)

    return ls


def _section(options) -> dict:
    """initializationOptions may be the settings themselves or {"memosight": {...}}."""
    if isinstance(options, dict) and isinstance(options.get(CONFIG_SECTION), dict):
        return options[CONFIG_SECTION]
    return options if isinstance(options, dict) else {"initializationOptions": options}


WATCH_REGISTRATION = "memosight-watched-files"


async def _watch_files(ls: MemoSightServer) -> None:
    """Ask the client to report source and config files that change on disk (a checkout, a
    formatter, another editor), for the workspace index and the config file. Clients that cannot
    register watchers dynamically are left alone: saves and closes still re-index a file."""
    caps = ls.client_capabilities.workspace
    watched = caps.did_change_watched_files if caps else None
    index = ls.workspace_index
    if index is None or not (watched and watched.dynamic_registration):
        return
    globs = sorted(f"**/*{suffix}" for suffix in index.language_of) + ["**/.memosight.toml", "**/pyproject.toml"]
    options = types.DidChangeWatchedFilesRegistrationOptions(
        watchers=[types.FileSystemWatcher(glob_pattern=glob) for glob in globs])
    try:
        await ls.connection.send_request(types.CLIENT_REGISTER_CAPABILITY, types.RegistrationParams(registrations=[
            types.Registration(id=WATCH_REGISTRATION, method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES,
                               register_options=options)]))
    except Exception as exc:  # a client that refuses must not stop the server
        log.warning("registering file watchers failed: %s", exc)


async def _pull_client_configuration(ls: MemoSightServer) -> None:
    caps = ls.client_capabilities.workspace
    if not (caps and caps.configuration):
        return
    try:
        result = await ls.connection.send_request(
            types.WORKSPACE_CONFIGURATION,
            types.ConfigurationParams(items=[types.ConfigurationItem(section=CONFIG_SECTION)]))
    except Exception as exc:  # a client that fails the request must not stop the server
        log.warning("workspace/configuration failed: %s", exc)
        return
    section = result[0] if result else None
    if isinstance(section, dict) and section:
        ls.config.client_values, errors = validate(section, "editor settings")
        ls.report_config_errors(errors)
        ls.apply_settings()


def _arrived(ls: MemoSightServer, uri: str, position: types.Position) -> Ticket:
    """The request's document and cursor as it arrives (the text is shared, not copied)."""
    doc = ls.document(uri)
    return Ticket.of(doc, doc.offset_at(_to_position(position)))


async def _inline_answer(ls: MemoSightServer, ticket: Ticket, position: types.Position):
    suggestion = await _suggestion_for(ls, ticket, position)
    if suggestion is None:
        return types.InlineCompletionList(items=[])
    # No range: the text is inserted at the cursor. (Neovim draws an item that has a range as an
    # overlay, which would hide the text after the cursor mid-line.)
    item = types.InlineCompletionItem(
        insert_text=suggestion.text,
        command=types.Command(title="Accept", command=ACCEPTED_COMMAND, arguments=[len(suggestion.text)]))
    return types.InlineCompletionList(items=[item])


async def _completion_answer(ls: MemoSightServer, ticket: Ticket, position: types.Position):
    suggestion = await _suggestion_for(ls, ticket, position)
    if suggestion is None:
        return types.CompletionList(is_incomplete=True, items=[])
    # built on the text the request saw: its range is in that version's positions
    return types.CompletionList(is_incomplete=True, items=[_completion_item(ticket.seen, suggestion)])


# What the embedded model was trained on (engine/models/default/README.md): others only where asked.
EMBEDDED_LANGUAGES = ("python",)


def _completes(ls: MemoSightServer, settings, language: str) -> bool:
    """Whether `language` is completed: the `languages` setting's, else every language, except that
    the embedded model keeps to Python unless `languages` names others (it says so once a language)."""
    if settings.languages:
        return language in settings.languages
    embedded = settings.engine.model is None and not settings.engine.backend.remote
    if not embedded or language in EMBEDDED_LANGUAGES:
        return True
    ls.report(f"MemoSight: the embedded model was trained on Python only, so it does not complete {language}. "
              f"Name a model that knows it (`model`, e.g. \"qwen2.5-coder-0.5b\"), or ask anyway with "
              f"`languages = [\"python\", \"{language}\"]`.", types.MessageType.Info)
    return False


async def _suggestion_for(ls: MemoSightServer, ticket: Ticket, position: types.Position) -> Suggestion | None:
    """The request's checks (language, size, binary), then the suggester's answer, its messages shown."""
    request_id = current_request_id()
    timeline = ls.timelines.start(request_id, ls.connection.read_at.get(request_id))  # ended once answered
    doc, uri = ticket.seen, ticket.seen.uri
    ls.reload_config_file_if_changed()
    settings = ls.settings
    if not _completes(ls, settings, doc.language):
        return None
    if doc.too_large:
        ls.report(f"MemoSight: {uri} is {len(doc.text) / 1e6:.1f} MB, over the 8 MB limit; no completions "
                  "for this file")
        return None
    if doc.looks_binary:
        ls.report(f"MemoSight: {uri} looks binary (it has NUL bytes); no completions for this file")
        return None

    def on_partial(text: str) -> None:  # only for clients that asked for streaming (see wants_partials)
        ls.connection.notify(PARTIAL_METHOD, {"id": request_id, "uri": uri, "position": {"line": position.line,
                                                                    "character": position.character},
                                           "text": text})

    answer = await ls.suggester.suggest(ticket, settings, on_partial if wants_partials(ls) else None,
                                        timeline=timeline)
    for message in answer.messages:
        ls.report(f"MemoSight: {message}", types.MessageType.Error)
    if ls.editor_log.tracing():  # every keystroke passes here: nothing built unless a trace is on
        shown = answer.suggestion.text if answer.suggestion is not None else ""
        ls.editor_log.trace_line(f"completion at {uri}:{position.line + 1}:{position.character + 1}: "
                                 f"{len(shown)} characters", verbose=shown or None)
    if answer.suggestion is None and ticket.doc.closed:
        # closed (or opened anew) while the request waited: LSP's answer for a request the document's
        # state overtook, which clients drop silently
        raise RequestError(CONTENT_MODIFIED, f"Content modified: {uri} was closed while the request was in flight")
    return answer.suggestion


def wants_partials(ls: MemoSightServer) -> bool:
    """Clients opt in to `memosight/partialCompletion` with experimental.memosight.partialCompletion."""
    experimental = ls.client_capabilities.experimental
    if isinstance(experimental, dict):
        own = experimental.get("memosight")
        return isinstance(own, dict) and bool(own.get("partialCompletion"))
    return False


def _lsp_position(doc: Document, offset: int) -> types.Position:
    p = doc.position_at(offset)
    return types.Position(p.line, p.character)


def _completion_item(doc: Document, suggestion: Suggestion) -> types.CompletionItem:
    """The suggestion as a completion item that replaces the word before the cursor, so that clients
    filtering on that word keep it."""
    text = doc.text
    start = suggestion.offset
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
        start -= 1
    word = text[start:suggestion.offset]
    new_text = word + suggestion.text
    edit_range = types.Range(_lsp_position(doc, start), _lsp_position(doc, suggestion.offset))
    label = new_text.split("\n", 1)[0].strip() or new_text.strip()
    return types.CompletionItem(
        label=label[:80], kind=types.CompletionItemKind.Text, detail="MemoSight",
        insert_text_format=types.InsertTextFormat.PlainText, filter_text=new_text,
        text_edit=types.TextEdit(edit_range, new_text), sort_text="0",
        documentation=new_text if "\n" in new_text else None,
        command=types.Command(title="Accept", command=ACCEPTED_COMMAND, arguments=[len(suggestion.text)]))
