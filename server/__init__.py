"""memosight.server: the language server. Never imports torch; the engine is reached through
memosight.engine's small interface."""

__version__ = "0.1.0"
