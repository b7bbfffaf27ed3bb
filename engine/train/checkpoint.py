"""Checkpoints of every trainer: one file per run, written atomically, restored exactly.

A checkpoint is a dict saved with torch.save: the trained weights under the trainer's own key
("model", "heads"), the optimizer state under "optimizer", and whatever else the trainer needs to
continue (its step, configuration, RNG states). The file names and keys are what runs written
earlier resume from: state.pt (base model), heads_state.pt (heads), finetune_state.pt (fine-tune).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch


def save(file: Path, weights_key: str, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
         **extra) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    payload = {weights_key: module.state_dict(), "optimizer": optimizer.state_dict(), **extra}
    tmp = file.with_name(file.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, file)  # a crash mid-write never leaves a broken checkpoint


def read(file: Path) -> dict:
    # On the CPU first: load_state_dict then moves every tensor to where its parameter lives.
    return torch.load(file, map_location="cpu", weights_only=False)


def restore(payload: dict, weights_key: str, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Load the weights and optimizer state of `payload` into `module` and `optimizer`; -> payload."""
    module.load_state_dict(payload[weights_key])
    optimizer.load_state_dict(payload["optimizer"])
    return payload


def load(file: Path, weights_key: str, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    return restore(read(file), weights_key, module, optimizer)
