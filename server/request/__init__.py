"""A completion request, from the editor's ask to the suggestion: the suggester's steps
(suggest.py), every model run (runs.py), the work done ahead of requests (ahead.py), the
completion cache, where a completion ends (mode.py), the engine's load and thread
(engine_choice.py), what the user is told (user_messages.py) and where the time went (timeline.py).
No LSP types here: lsp.py translates."""
