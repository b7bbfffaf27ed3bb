"""What the benchmarks ask of the in-process engine beside completions: how well a context predicts
the true text (its loss), the same after a keystroke's moved cells, and the attention lines pay to
each other. A mixin of LocalEngine (engines/local.py), which holds the model, runtime and lock."""

from __future__ import annotations

import contextlib

import numpy as np

from ..protocol import EngineError


class Measures:
    def continuation_loss(self, prefix: str, suffix: str, continuation: str) -> tuple[float, int]:
        """Negative log-likelihood (summed, nats) and token count of `continuation` written at the
        cursor between `prefix` and `suffix`: how well a context predicts the true text, a finer
        measure than exact match when a small model rarely gets a whole line right."""
        prompt, target = self.prompt_ids(prefix, suffix), self.encode(continuation)
        if not target:
            return 0.0, 0
        if self.model is None and hasattr(self.runtime, "continuation_logits"):  # llama.cpp: its own kernels
            with self._lock:
                logits = self.runtime.continuation_logits(prompt, target)
            return _nll(logits, target), len(target)
        self._needs_torch("continuation_loss")
        import torch

        ids = torch.tensor([prompt + target], device=self.device)
        threads = self.prompt_cache.prefill_threads  # a whole prompt at once: on the cores a prefill uses
        with self._lock, threads.fastest() if threads else contextlib.nullcontext(), torch.inference_mode():
            logits = self.model(ids).logits[0, len(prompt) - 1:-1].float()
            loss = torch.nn.functional.cross_entropy(logits, ids[0, len(prompt):], reduction="sum")
        return float(loss), len(target)

    def keystroke_loss(self, before: tuple[str, str], after: tuple[str, str], continuation: str,
                       recompute: int | None) -> tuple[float, int, int]:
        """The true `continuation`'s NLL (nats, summed), its tokens, and how many of its first
        tokens greedy decoding gets right, at the cursor `after` (prefix, suffix) with the cache
        brought there from the prompt at `before` as a keystroke brings it: runs that moved reused
        past their first `recompute` tokens (llamacpp_prompt.py). `recompute=None`: a fresh prefill.
        llama.cpp only: the torch runtimes compute every token after the common prefix."""
        if not hasattr(self.runtime, "recompute"):
            raise EngineError("moved cells are reused on llama.cpp only: load a GGUF model with runtime = \"llamacpp\"")
        target = self.encode(continuation)
        if not target:
            return 0.0, 0, 0
        with self._lock:
            runtime, kept = self.runtime, self.runtime.recompute
            try:  # what the cache holds exactly stays (the prompts' common head): the rest is computed
                runtime.make_exact()
                runtime.recompute = None
                if recompute is not None:
                    runtime.prefill_hidden(self.prompt_ids(*before))
                    runtime.recompute = recompute
                logits = runtime.continuation_logits(self.prompt_ids(*after), target, exact=recompute is None)
            finally:
                runtime.recompute = kept
        right = next((k for k, row in enumerate(logits) if int(row.argmax()) != target[k]), len(target))
        return _nll(logits, target), len(target), right

    def line_attention(self, text: str, rows: list[int], query_lines: int = 8,
                       window_tokens: int = 1024) -> dict[int, tuple[int, list[float]]]:
        """The attention the lines above each of `rows` pay to the lines before them (attention.py)."""
        self._needs_torch("line_attention")
        from ..decoding.attention import line_attention

        with self._lock:
            return line_attention(self.model, self.encode, text, rows, query_lines, window_tokens)

    def _needs_torch(self, what: str) -> None:
        if self.model is None:
            raise EngineError(f"{what} reads the model's own tensors: load it with runtime = \"torch\" "
                              f"(this engine runs on {self.runtime.name})")


def _nll(logits: np.ndarray, target: list[int]) -> float:
    """The summed negative log-likelihood of `target` under `logits` (row k predicts target[k])."""
    logits = logits.astype(np.float64)
    top = logits.max(axis=1)
    log_z = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
    return float((log_z - logits[np.arange(len(target)), target]).sum())
