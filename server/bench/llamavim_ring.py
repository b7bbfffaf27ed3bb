"""llama.vim's ring of extra context, as typing_llamavim.py's client keeps it: `s:pick_chunk` (a queue
of up to 16 chunks of the user's files, similarity eviction above 0.9), `s:chunk_sim`,
`s:ring_get_extra`, and the data side of `s:ring_update` (one queued chunk moved into the ring of
ring_n_chunks). The client owns the timers and the requests; this is the state they work on."""

from __future__ import annotations

import os
import random
import re
import time

NON_WORD = re.compile(r"[^0-9A-Za-z_]+")  # Vim's \W


def chunk_sim(c0: list[str], c1: list[str]) -> float:
    """s:chunk_sim: 2 * (tokens of c1 found in c0's set) / (tokens of both)."""
    tokens0 = [t for t in NON_WORD.split("\n".join(c0)) if t]
    tokens1 = [t for t in NON_WORD.split("\n".join(c1)) if t]
    if not tokens0 and not tokens1:
        return 1.0
    set0 = set(tokens0)
    return 2.0 * sum(t in set0 for t in tokens1) / (len(tokens0) + len(tokens1))


class Ring:
    QUEUE_MAX = 16  # s:pick_chunk's "TODO: become parameter ?"

    def __init__(self, cfg: dict, rng: random.Random):
        self.cfg, self.rng = cfg, rng
        self.chunks: list[dict] = []  # in the ring: sent as input_extra
        self.queued: list[dict] = []  # picked, waiting for a ring update
        self.n_evict = 0

    def random_chunk(self, text: list[str]) -> list[str]:
        half = self.cfg["ring_chunk_size"] // 2
        l0 = self.rng.randint(0, max(0, len(text) - half))
        return text[l0:min(l0 + half, len(text)) + 1]  # Vim's text[l0:l1] includes l1

    def pick(self, text: list[str], path: str, modified: bool, no_mod: bool, do_evict: bool) -> None:
        """s:pick_chunk: queue a random chunk of `text` unless it is there already or (without
        do_evict) too similar to one that is."""
        if no_mod and (modified or not os.path.isfile(path)):
            return
        if self.cfg["ring_n_chunks"] <= 0 or len(text) < 3:
            return
        chunk = text if len(text) + 1 < self.cfg["ring_chunk_size"] else self.random_chunk(text)
        if any(c["data"] == chunk for c in self.chunks + self.queued):
            return
        for chunks in (self.queued, self.chunks):
            for i in range(len(chunks) - 1, -1, -1):
                if chunk_sim(chunks[i]["data"], chunk) > 0.9:
                    if not do_evict:
                        return
                    del chunks[i]
                    self.n_evict += 1
        if len(self.queued) == self.QUEUE_MAX:
            del self.queued[0]
        now = time.monotonic()
        self.queued.append({"data": chunk, "str": "\n".join(chunk) + "\n",
                            "time": [int(now), int(now % 1 * 1e6)], "filename": path})

    def evict_like(self, chunk: list[str], above: float) -> None:
        """Drop ring chunks more similar than `above` to `chunk` (llama#fim: 0.5, the text at the cursor)."""
        for i in range(len(self.chunks) - 1, -1, -1):
            if chunk_sim(self.chunks[i]["data"], chunk) > above:
                del self.chunks[i]
                self.n_evict += 1

    def extra(self) -> list[dict]:
        """s:ring_get_extra: the ring as /infill's input_extra."""
        return [{"text": c["str"], "time": c["time"], "filename": c["filename"]} for c in self.chunks]

    def rotate(self) -> bool:
        """One queued chunk into the ring (the oldest goes when it is full); False: none queued."""
        if not self.queued:
            return False
        if len(self.chunks) == self.cfg["ring_n_chunks"]:
            del self.chunks[0]
        self.chunks.append(self.queued.pop(0))
        return True
