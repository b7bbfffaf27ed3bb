"""Loading models: clear errors that name the model and the fix."""

import pytest
import torch

from memosight.engine import EngineError, load_engine
from memosight.engine.loading import ModelLoadError


def test_missing_model_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_engine(str(tmp_path / "nope"))


def test_corrupt_model_folder_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="incomplete or corrupt"):
        load_engine(str(tmp_path))


def test_unknown_hub_id_offline_names_the_fix():
    with pytest.raises(ModelLoadError, match="hf download"):
        load_engine("nobody-here/no-such-model")


def test_cuda_requested_without_cuda_is_a_clear_error(tiny_model_dir):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ModelLoadError, match="CUDA is not available"):
        load_engine(str(tiny_model_dir), device="cuda")


def test_load_errors_are_engine_errors_the_command_line_reports_in_one_line():
    assert issubclass(ModelLoadError, EngineError)


def test_pickled_weights_are_refused_and_never_unpickled(tmp_path, tiny_model_dir):
    import pickle
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    for weights in folder.glob("*.safetensors"):
        weights.unlink()
    marker = tmp_path / "ran"

    class Payload:  # unpickling this would create the marker file
        def __reduce__(self):
            return (open, (str(marker), "w"))
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(ModelLoadError, match="only from .safetensors"):
        load_engine(str(folder))
    assert not marker.exists()
