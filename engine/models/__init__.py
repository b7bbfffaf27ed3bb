"""The models that ship inside the package. Named here, without torch, so that the llama.cpp path can
find the embedded model's files without importing torch's loading."""

from pathlib import Path

DEFAULT_MODEL_DIR = Path(__file__).parent / "default"
