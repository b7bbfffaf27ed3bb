import pytest

from memosight.engine.protocol import EngineInfo
from memosight.server.config import Settings
from memosight.server.context.service import ContextService
from memosight.server.documents import Document


class Engine:
    def __init__(self, fim: bool = True):
        self.fim = fim

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def info(self) -> EngineInfo:
        return EngineInfo("test", "cpu", "float32", has_fim=self.fim)


def test_a_request_at_the_warm_ups_text_and_cursor_gets_its_context_and_any_other_a_new_one():
    service, engine, settings = ContextService(), Engine(), Settings(context_budget=64)
    doc = Document("file:///a.py", "x = 1\ny = \n", "python", 1)
    warm = service.build_for_warm_up(engine, doc, 10, settings)
    assert service.for_request(engine, doc, 10, settings, lambda stage: None) is warm
    assert service.for_request(engine, doc, 6, settings, lambda stage: None) is not warm  # another cursor
    edited = Document("file:///a.py", "x = 1\ny = 2\n", "python", 2)
    assert service.for_request(engine, edited, 10, settings, lambda stage: None) is not warm  # another text


def test_a_model_without_fim_tokens_gets_no_suffix_budget():
    service, settings = ContextService(), Settings(suffix_share=0.25, suffix_tokens=10_000)
    assert service.suffix_share(Engine(fim=True), settings) == 0.25
    assert service.suffix_share(Engine(fim=False), settings) == 0.0


@pytest.mark.parametrize("budget, tokens", [(1024, 64), (1024, 0), (777, 33), (64, 10_000)])
def test_the_suffix_is_bounded_in_tokens_whatever_the_budget(budget, tokens):
    settings = Settings(context_budget=budget, suffix_share=0.25, suffix_tokens=tokens)
    share = ContextService().suffix_share(Engine(fim=True), settings)
    assert int(budget * share) == min(tokens, int(budget * 0.25))
