"""What the llama.cpp decoders' tests ask of each: a cold run, a run from a cached prompt, a short run."""


def cold_warm_short(decoder, ids: list[int], tokens: int, eos_ids) -> tuple[list[int], list[int], list[int]]:
    """`tokens` greedy tokens cold; again after prefilling all but the last prompt token (what a
    keystroke finds cached); and 3 tokens. The decoder is closed after."""
    try:
        cold = decoder.generate(ids, tokens, eos_ids)
        decoder.prefill(ids[:-1])
        warm = decoder.generate(ids, tokens, eos_ids)
        short = decoder.generate(ids, 3, eos_ids)
    finally:
        decoder.close()
    return cold, warm, short
