"""Export: a folder from_pretrained loads, and a model card that names its sources without paths."""

from __future__ import annotations

import dataclasses
import platform

from memosight.engine.train.corpus import resolve_sources
from memosight.engine.train.export import export_model, model_card
from memosight.engine.train.loop import HeldOut, RunState, TrainConfig
from memosight.engine.train.model import PRESETS, build_model


def test_the_card_names_sources_by_package_and_version_never_by_path():
    sources = resolve_sources(["stdlib", "site"])
    state = RunState(PRESETS["tiny"], TrainConfig(), step=3, command=["memosight train model --size tiny"])
    card = model_card(state, 1234, sources, {"train_files": 2}, {"validation": HeldOut(3.2, 0.4, 100)})
    assert f"- Python {platform.python_version()} standard library: PSF-2.0" in card
    assert all(str(s.root) not in card for s in sources)
    assert "| validation | 100 | 3.2000 | 0.4000 |" in card and "--size tiny" in card


def test_export_writes_a_loadable_readable_folder(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = build_model(dataclasses.replace(PRESETS["tiny"], vocab_size=len(tokenizer)))
    export_model(model, tokenizer, tmp_path / "out", "# card\n", {"steps": 0})
    assert (tmp_path / "out" / "README.md").read_text() == "# card\n"
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in (tmp_path / "out").iterdir())
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert loaded.dtype.is_floating_point and loaded.config.vocab_size == len(tokenizer)
