"""The base model: presets build a Llama with tied embeddings and the EOS token as padding."""

from __future__ import annotations

import dataclasses

from memosight.engine.train.model import PRESETS, build_model, count_params


def test_presets_build_a_tied_llama_that_stops_and_pads_with_eos():
    cfg = dataclasses.replace(PRESETS["tiny"], vocab_size=300, eos_token_id=0)
    model = build_model(cfg, seed=0)
    assert model.config.tie_word_embeddings and model.get_input_embeddings().weight is model.lm_head.weight
    assert model.generation_config.eos_token_id == model.generation_config.pad_token_id == 0
    assert count_params(model) == 300 * 32 + 2 * 9_280 + 32  # embeddings once (tied), 2 blocks, the final norm
    same = build_model(cfg, seed=0)
    assert all(a.equal(b) for a, b in zip(model.parameters(), same.parameters()))  # the seed decides the init
