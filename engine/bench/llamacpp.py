"""llama.cpp in-process (llama-cpp-python) on the same GGUF file: what a user would run instead.

Two decoders for `bench speculative`: plain greedy, and greedy with llama.cpp's own prompt-lookup
drafts (`LlamaPromptLookupDecoding`). Both are fed the engine's own token ids (the GGUF's
vocabulary is the engine's), keep their KV cache between calls as llama.cpp does (a prompt that
extends the last one evaluates only its new tokens), and run on the thread count they are given:
the same as the engine's, so that the comparison is core for core.

llama.cpp's "extra buffer types" (its AMX and repacked-weight layouts) are turned off: built
natively on this 2-core Xeon (AMX_INT8), llama-cpp-python 0.3.36 crashed (SIGSEGV in decode) on
every batch of more than one token of a Q4_1 or Q4_K_M model with them on; without them it runs
(SmolLM2 Q4_1, 1 thread: ~146 tokens/s prefill, ~46 decode, measured here).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path


def gguf_of(model_dir: str | None) -> Path | None:
    """The GGUF file a model folder was dequantized from (engine/loading/gguf.py writes memosight.json)."""
    if not model_dir:
        return None
    marker = Path(model_dir) / "memosight.json"
    if not marker.is_file():
        return None
    file = json.loads(marker.read_text()).get("gguf_file")
    return Path(file) if file and Path(file).is_file() else None


def build_flags() -> str:
    """What the installed llama-cpp-python was compiled with, as llama.cpp reports it (its CPU
    features: AVX2, AVX512, AMX, ...): the label of its columns, which are not the native build's."""
    try:
        import llama_cpp
    except ImportError:
        return "not installed"
    from ..runtime.llamacpp import build_flags as system_info

    return f"llama-cpp-python {llama_cpp.__version__}: " + system_info(llama_cpp)


class LlamaCppDecoder:
    """Greedy decoding in llama.cpp, with or without its prompt-lookup drafts."""

    def __init__(self, gguf: Path, threads: int, prompt_lookup: bool = False, n_ctx: int = 4096):
        try:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        except ImportError as exc:
            raise RuntimeError("llama-cpp-python is not installed: pip install 'memosight[dev]' (it builds "
                               "llama.cpp from source, minutes on a small machine)") from exc
        draft = LlamaPromptLookupDecoding(num_pred_tokens=10) if prompt_lookup else None
        with _without_extra_buffers():
            self.llm = Llama(model_path=str(gguf), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                             n_batch=512, verbose=False, draft_model=draft)

    def prefill(self, ids: list[int]) -> None:
        """A fresh cache holding `ids` (what a keystroke finds cached)."""
        self.llm.reset()
        if ids:
            self.llm.eval(ids)

    def generate(self, ids: list[int], max_new_tokens: int, eos_ids: set[int]) -> list[int]:
        """Greedy tokens after `ids`, ending at EOS (included) or the limit; the cached prefix of
        `ids` is not evaluated again."""
        out: list[int] = []
        if max_new_tokens <= 0:
            return out
        for token in self.llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
            out.append(int(token))
            if token in eos_ids or len(out) >= max_new_tokens:
                break
        return out

    def close(self) -> None:
        self.llm.close()


@contextlib.contextmanager
def _without_extra_buffers():
    """Llama() reads llama.cpp's default model parameters; for its duration they say
    use_extra_bufts = False (Llama() has no argument for it)."""
    import llama_cpp.llama_cpp as native

    defaults = native.llama_model_default_params

    def patched():
        params = defaults()
        params.use_extra_bufts = False
        return params

    native.llama_model_default_params = patched
    try:
        yield
    finally:
        native.llama_model_default_params = defaults
