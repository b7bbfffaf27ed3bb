"""The llama.cpp runtime's prompt: sequence 0 brought to a new prompt with as little computed as the
cells already cached allow, and made exact again when there is time.

A keystroke, in named steps (`_bring_to`):

1. keep the common prefix in place;
2. plan (moves.py) which cached runs the new prompt holds elsewhere: the FIM suffix behind the typed
   text, a region of context that moved; each is moved past its first `recompute` tokens;
3. park each moved run in a sequence of its own (`llama_memory_seq_cp`), drop sequence 0's cells
   after the prefix;
4. compute the new prompt's pieces in order into sequence 0, placing each parked run when its turn
   comes (llama.cpp takes a sequence's new tokens only right after its last position), shifted to
   its new positions just before (`llama_memory_seq_add`: a cell shifts for every sequence holding
   it, so only its parking sequence may).

A stop (the next key) shifts and parks the runs not yet placed: the next prompt may still use them.

The moved cells were computed against the old text: `stale_from` is the first position whose cells
are not what a fresh prefill would give. `refresh` computes them again exactly, a chunk at a time in a
scratch sequence that holds the prefix before them, then swaps the chunk into sequence 0, so a stop
loses at most the chunk under way. The server calls it when the user pauses.
"""

from __future__ import annotations

import time
from os.path import commonprefix

from . import Interrupted
from .moves import Move, Source, pieces, plan

MAX_MOVES = 8  # runs moved at most per prompt (each parks in a sequence of its own)
# Tokens of each moved run computed again against the new text: the fewest within 1% of a fresh
# prefill's loss with its greedy agreement, at cursors inside functions and at their end (Qwen2.5-
# Coder-0.5B Q4_K_M, held-out code, `memosight bench context --recompute`; none: +117% and +299%):
# docs/BENCHMARKS.md, "A keystroke's moved cells".
RECOMPUTE = 8
# Tokens typed before moved cells, since they were exact, after which a key computes them all: the
# staleness bound when the user types on without a pause (the pause's refresh is the usual way).
MAX_DRIFT = 64


class PromptCells:
    """The prompt half of LlamaCppRuntime (which sets the sequence ids and the decode)."""

    def _setup_prompt(self, park_seq: int, refresh_seq: int, tree_room: int) -> None:
        self.tree_room = tree_room  # cells a draft tree may need after a prompt
        self.park_seqs = list(range(park_seq, park_seq + MAX_MOVES))
        self.refresh_seq = refresh_seq
        self.recompute: int | None = RECOMPUTE  # None: every prompt computed exactly (the `exact_prompt` setting)
        self.stale_from: int | None = None  # the first position whose cells an older text computed
        self.prompt_len = 0  # the last prompt's length (sequence 0 holds generated tokens after it)
        self.parked: list[Source] = []  # runs a stopped prefill left parked, at their new positions
        self.drift = 0  # tokens computed before stale cells since they were exact (MAX_DRIFT)
        self.last_computed = 0  # tokens the last prefill computed
        self._move_seqs: dict[int, int] = {}
        self.shift_pending = False  # moved cells whose keys llama.cpp rotates at the next decode
        self.moved_tokens = 0  # figures: cells moved into place, cells refreshed
        self.refreshed_tokens = 0

    # --- a keystroke ------------------------------------------------------------------------------

    def _bring_to(self, input_ids: list[int], cancel=None) -> int:
        """Sequence 0 brought to `input_ids`; returns how far it got (less where `cancel` stopped
        it). The last token is always computed: its logits are what a prefill is for."""
        if (self.stale_from is not None or self.parked) and self.drift > MAX_DRIFT:
            self.make_exact()  # typed on too long without a pause: this key computes it all
        keep = len(commonprefix([self.tokens, input_ids])) if self.reuse else 0
        keep = max(0, min(keep, len(input_ids) - 1))
        moves = self._plan(input_ids, keep)
        drift = self.drift + (max(0, moves[0].new_start - self.recompute - keep) if moves else 0)
        self._park(moves, keep)  # (the crop there forgets the old cells' drift: they move on with it)
        stale = self.stale_from if self.stale_from is not None and self.stale_from < keep else None
        self.last_computed = 0
        reached = len(input_ids)
        order = pieces(moves, keep, len(input_ids))
        try:
            for n, (start, end, move) in enumerate(order):
                if move is not None:
                    self._place(move, input_ids[start:end])
                    stale = start if stale is None else stale
                    continue
                # before a moved run: its last R tokens are this key's alone (the next computes them again)
                redone = n + 1 < len(order) and order[n + 1][2] is not None
                got = self._run(input_ids[start:end], start, last_output=end == len(input_ids), cancel=cancel,
                                redone=redone)
                self.last_computed += got - start
                if got < end:
                    unplaced = [m for _, _, m in order[n + 1:] if m is not None]
                    for move in unplaced:
                        self._shift(move)
                    self.parked = [Source(self._move_seqs.pop(id(m)), m.new_start, input_ids[m.new_start:m.new_end])
                                   for m in unplaced]
                    reached = got
                    break
        finally:  # an error part way: no parking sequence keeps cells nobody knows of
            for seq in self._move_seqs.values():
                self.L.llama_memory_seq_rm(self.memory, seq, -1, -1)
            self._move_seqs = {}
        self.stale_from = stale if stale is not None and stale < len(self.tokens) else None
        self.drift = drift if self.stale_from is not None or self.parked else 0
        self.prompt_len = reached  # a stopped one: what is there of it
        return reached

    def _plan(self, input_ids: list[int], keep: int) -> list[Move]:
        if self.recompute is None or not self.reuse:
            self._drop_parked()
            return []
        sources = [Source(0, 0, self.tokens)] + self.parked
        return plan(sources, keep, input_ids, self.recompute, max_moves=MAX_MOVES)

    def _park(self, moves: list[Move], keep: int) -> None:
        """Each move's cells alone in a parking sequence, shifted to their new positions; sequence 0
        cut to `keep`; parked runs no move uses dropped."""
        L, memory = self.L, self.memory
        reused = {m.source.seq for m in moves if m.source.seq != 0}
        free = [s for s in self.park_seqs if s not in reused]
        for source in self.parked:
            if source.seq not in reused:
                L.llama_memory_seq_rm(memory, source.seq, -1, -1)
        self.parked = []
        seqs = []
        for move in moves:
            if move.source.seq == 0:
                seq = free.pop(0)
                L.llama_memory_seq_cp(memory, 0, seq, move.old_start, move.old_start + move.length)
            else:  # a run a stopped prefill parked: keep the part moved
                seq = move.source.seq
                L.llama_memory_seq_rm(memory, seq, -1, move.old_start)
                L.llama_memory_seq_rm(memory, seq, move.old_start + move.length, -1)
            seqs.append(seq)
        self._crop(keep)
        self._move_seqs = dict(zip(map(id, moves), seqs))  # those not placed yet

    def _shift(self, move: Move) -> None:
        """The move's parked cells to their new positions. llama.cpp rotates their keys at the next
        decode, which may then not stop (`_stoppable`): shifted just before they are placed, that
        decode is the one after them (at a keystroke, the prompt's last token alone)."""
        self.L.llama_memory_seq_add(self.memory, self._move_seqs[id(move)], -1, -1, move.shift)
        self.shift_pending |= move.shift != 0

    def _place(self, move: Move, tokens: list[int]) -> None:
        self._shift(move)
        seq = self._move_seqs.pop(id(move))
        self.L.llama_memory_seq_cp(self.memory, seq, 0, -1, -1)
        self.L.llama_memory_seq_rm(self.memory, seq, -1, -1)
        self.tokens = self.tokens + tokens
        self.moved_tokens += len(tokens)

    def _drop_parked(self) -> None:
        for source in self.parked:
            self.L.llama_memory_seq_rm(self.memory, source.seq, -1, -1)
        self.parked = []

    # --- the requests' entry points ---------------------------------------------------------------

    def prefill_hidden(self, input_ids: list[int], cancel=None):
        """Sequence 0 brought to exactly `input_ids`, the longest cached prefix kept and moved runs
        reused; the last position's hidden state and logits. Raises Interrupted when `cancel` is set
        part way."""
        started = time.perf_counter()
        self.prompt_tokens += len(input_ids)
        if (warmed := self._warmed(input_ids, started)) is not None:
            return warmed
        self._check_length(input_ids)
        reached = self._bring_to(input_ids, cancel)
        self.last_lookup_ms = 0.0
        self.last_prefill_ms = (time.perf_counter() - started) * 1000
        if reached < len(input_ids):
            raise Interrupted("the prefill was stopped: its request was cancelled")
        self.reused_tokens += len(input_ids) - self.last_computed
        return self._hidden(self._last_row), self._logits(self._last_row)

    def warm(self, input_ids: list[int], cancel, chunk: int = 64) -> int:
        """`input_ids` computed ahead of a request (a stop ends it between llama.cpp's nodes); when
        all are in, the logits after them wait for the request with this very prompt. Returns the
        tokens computed."""
        self._ready = None
        if not input_ids or not self._fits(input_ids):
            return 0
        reached = self._bring_to(input_ids, cancel)
        if reached == len(input_ids) and self.last_computed:
            self._ready = (list(input_ids), self._hidden(self._last_row), self._logits(self._last_row))
        return self.last_computed

    def refresh(self, cancel, chunk: int = 32) -> int:
        """The last prompt's stale cells computed again exactly, `chunk` tokens a decode, until done
        or `cancel` is set; what was generated after the prompt is dropped. Returns the tokens
        recomputed. When it finishes, the logits after the prompt wait for a request with it."""
        if self.stale_from is None or self.parked or not self.prompt_len:
            return 0
        L, memory, scratch = self.L, self.memory, self.refresh_seq
        end = min(self.prompt_len, len(self.tokens))  # (a stopped prefill holds less)
        self._ready = None
        self._crop(end)
        done = 0
        while self.stale_from is not None and not cancel.is_set():
            start = self.stale_from
            stop = min(start + chunk, end)
            last = stop == end
            L.llama_memory_seq_cp(memory, 0, scratch, 0, start)  # the exact prefix, shared
            self._embeddings(self.with_hidden and last)
            try:
                with self.stop.watching(self._stoppable(cancel)):
                    self._decode_padded([(t, start + k, (scratch,), last and start + k == stop - 1)
                                         for k, t in enumerate(self.tokens[start:stop])])
            except BaseException as exc:  # stopped by a key (or failed): sequence 0 is as it was
                L.llama_memory_seq_rm(memory, scratch, -1, -1)
                if isinstance(exc, Interrupted):
                    break
                raise
            finally:
                self._embeddings(self.with_hidden)
            L.llama_memory_seq_rm(memory, 0, start, stop)  # the stale chunk out, the exact one in
            L.llama_memory_seq_cp(memory, scratch, 0, start, stop)
            L.llama_memory_seq_rm(memory, scratch, -1, -1)
            done += stop - start
            self.stale_from = None if last else stop
            self.drift = 0 if last else self.drift
            if last:
                self._ready = (list(self.tokens), self._hidden(self._last_row), self._logits(self._last_row))
        self.refreshed_tokens += done
        return done

    def _fits(self, input_ids: list[int]) -> bool:
        return len(input_ids) <= self.n_ctx - self.tree_room

    def _check_length(self, input_ids: list[int]) -> None:
        if not self._fits(input_ids):
            from ..protocol import EngineError

            raise EngineError(f"the prompt is {len(input_ids)} tokens, over this context's {self.n_ctx}: lower "
                              f"`context_budget` to {self.n_ctx - self.tree_room} or less")

    def make_exact(self) -> None:
        """Stale cells and parked runs dropped: the next prompt is computed exactly (what is kept
        of it, its common prefix, was)."""
        self._drop_parked()
        if self.stale_from is not None:
            self._crop(self.stale_from)
        self.drift = 0

    def moves_json(self) -> dict:
        return {"recompute": self.recompute, "stale_from": self.stale_from, "drift": self.drift,
                "moved_tokens": self.moved_tokens, "refreshed_tokens": self.refreshed_tokens}
