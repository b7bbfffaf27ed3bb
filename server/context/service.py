"""What the model sees at a cursor, for the request lifecycle (suggest.py): the compressed context
of a document, the other open documents and the workspace files that define names used near the
cursor, with the one context a warm-up built kept for the request that follows it."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable

from memosight.engine.protocol import Engine

from ..config import Settings
from ..documents import Document
from .packed import PackedContext
from .packing import ContextCompressor, bounded_share
from .truncation import truncate_around_cursor
from .workspace import WorkspaceIndex

log = logging.getLogger(__name__)


class ContextService:
    def __init__(self, open_documents: Callable[[], list[Document]] = list,
                 workspace: Callable[[], WorkspaceIndex | None] = lambda: None):
        self._open_documents = open_documents  # their definitions may enter the context
        self._workspace = workspace  # unopened files of the workspace, for the names used near the cursor
        self.compressor = ContextCompressor()
        # the context the last warm-up built, for a request at the same text and cursor to reuse
        self._warm: tuple[tuple, PackedContext] | None = None
        self._fim_of: tuple[weakref.ref, bool] | None = None  # (the engine, whether its prompts have FIM tokens)

    def build(self, engine: Engine, doc: Document, cursor: int, settings: Settings,
              others: list[Document] | None = None, mark: Callable[[str], None] | None = None) -> PackedContext:
        """The compressed context at `cursor`: regions of `doc`, of the other open documents
        (`others`, else every open document) and of the workspace files that define names used near
        the cursor, packed into settings.context_budget model tokens."""
        try:
            if others is None:
                others = self._open_documents()
            others = others + self.workspace_documents(doc, cursor, others)
            if mark is not None:
                mark("workspace")  # a stage of the request's timeline
            return self.compressor.build(doc, cursor, settings.context_budget, self.suffix_share(engine, settings),
                                         engine.count_tokens, others)
        except Exception:  # noqa: BLE001 - a compressor bug must not cost the user the completion
            log.exception("context compression failed; falling back to plain truncation")
            return truncate_around_cursor(doc.text, cursor, settings.context_budget,
                                          self.suffix_share(engine, settings), engine.count_tokens, doc.path)

    def build_for_warm_up(self, engine: Engine, view: Document, cursor: int, settings: Settings) -> PackedContext:
        """A warm-up's context, kept for the request at this very text and cursor."""
        context = self.build(engine, view, cursor, settings)
        self._warm = (self._key(view, cursor, settings), context)
        return context

    def for_request(self, engine: Engine, view: Document, cursor: int, settings: Settings,
                    mark: Callable[[str], None]) -> PackedContext:
        """The warm-up's context when it was built for this very text and cursor (the request came
        after an edit and no more typing), else a new one."""
        warm = self._warm
        if warm is not None and warm[0] == self._key(view, cursor, settings):
            mark("context")
            return warm[1]
        return self.build(engine, view, cursor, settings, mark=mark)

    def suffix_share(self, engine: Engine, settings: Settings) -> float:
        """settings.suffix_share, bounded by settings.suffix_tokens, or 0 for a model without FIM
        tokens: its prompt is the text before the cursor alone, so a budget kept for the text after
        it would be thrown away."""
        if self._fim_of is None or self._fim_of[0]() is not engine:
            self._fim_of = (weakref.ref(engine), engine.info().has_fim)
        if not self._fim_of[1]:
            return 0.0
        return bounded_share(settings.suffix_share, settings.suffix_tokens, settings.context_budget)

    def workspace_documents(self, doc: Document, cursor: int, open_docs: list[Document]) -> list[Document]:
        """Unopened workspace files that define names used near the cursor (see workspace.py)."""
        index = self._workspace()
        return [] if index is None else index.documents_for(doc, cursor, open_docs)

    def _key(self, view: Document, cursor: int, settings: Settings) -> tuple:
        """What a context depends on: this text and cursor, the budget, and every open document's
        version (their definitions may be in it) and where the user last worked in it."""
        others = tuple((d.uri, d.version, len(d.text), d.recent_rows) for d in self._open_documents())
        return (view.uri, view.version, id(view.text), len(view.text), cursor, settings.context_budget,
                settings.suffix_share, settings.suffix_tokens, others)
