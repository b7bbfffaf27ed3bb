"""What `memosight bench typing` asks of a system (typing_system.py): the stats a system reports,
and the TypingSystem protocol that each system the bench builds keeps to, method for method."""

import inspect

import pytest

from memosight.server.bench.typing_llamavim import LlamaVimSystem
from memosight.server.bench.typing_lsp import LspSystem
from memosight.server.bench.typing_system import SystemStats, TypingSystem

# the events the typist sends, in the protocol's own words
EVENTS = ["start", "open", "edit", "visible", "close", "stop"]


def test_stats_start_at_zero_and_each_system_gets_its_own_lists():
    first, second = SystemStats(), SystemStats()
    assert (first.requests, first.latencies_ms, first.model_cpu_s, first.notes) == (0, [], 0.0, {})
    # two systems typed in one run: one's latencies or notes must not show up in the other's report
    first.latencies_ms.append(12.5)
    first.notes["cache_hits"] = 3
    assert second.latencies_ms == [] and second.notes == {}


def test_the_protocol_names_every_event_the_typist_sends():
    declared = [name for name, member in vars(TypingSystem).items()
                if inspect.isfunction(member) and not name.startswith("__")]  # Protocol adds its own __init__
    assert sorted(declared) == sorted(EVENTS)
    assert "name" in TypingSystem.__annotations__


@pytest.mark.parametrize("system", [LspSystem, LlamaVimSystem], ids=["memosight-lsp", "llamavim"])
def test_each_system_has_every_event_with_the_protocols_parameters_and_async_ness(system):
    for event in EVENTS:
        declared, implemented = getattr(TypingSystem, event), getattr(system, event)
        # the typist awaits every event but visible(), which it calls between keys
        assert inspect.iscoroutinefunction(implemented) == inspect.iscoroutinefunction(declared), event
        assert list(inspect.signature(implemented).parameters) == list(inspect.signature(declared).parameters), event
