import pytest

from memosight.engine.protocol import (BackendSpec, Completion, CompletionRequest, EngineError, EngineSpec, Stream,
                                       valid_text)


def test_lone_surrogates_become_one_replacement_character_each_so_offsets_hold():
    assert valid_text("a\ud800b\udfff") == "a\ufffdb\ufffd"
    request = CompletionRequest("x\ud800", "\udc00y")
    assert request.prefix == "x\ufffd" and request.suffix == "\ufffdy"


def test_a_stream_gives_its_pieces_then_its_completion_and_a_closed_one_says_it_ended_early():
    def pieces():
        yield "a"
        yield "b"
        return Completion("ab", 2, 3, 1.0, 0.5, "eos")
    stream = Stream(pieces())
    assert list(stream) == ["a", "b"] and stream.completion.text == "ab"
    assert Stream(pieces()).result().stop_reason == "eos"
    cut = Stream(pieces())
    next(cut)
    cut.close()
    with pytest.raises(EngineError, match="closed before it ended"):
        cut.result()


def test_an_engine_spec_is_local_unless_its_backend_names_a_server():
    assert not EngineSpec().backend.remote
    assert EngineSpec(backend=BackendSpec(kind="llamacpp", url="http://h:8080")).backend.remote
