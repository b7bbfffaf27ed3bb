from memosight.engine.protocol import EngineSpec
from memosight.server.request.engine_choice import EngineHolder


class Closable:
    def __init__(self, name):
        self.name, self.closed = name, False

    def close(self):
        self.closed = True


def test_the_holder_loads_once_per_engine_and_runs_work_after_the_load_in_order():
    loads = []

    def load(spec):
        loads.append(spec.model)
        return Closable(spec.model)
    holder = EngineHolder(load, say=None)
    first, started = holder.ensure(EngineSpec(model="a"))
    again, started_again = holder.ensure(EngineSpec(model="a"))  # an equal spec
    assert started and not started_again and again is first
    order = []
    holder.submit(order.append, "after the load").result()
    assert holder.ready().name == "a" and order == ["after the load"]
    other, started = holder.ensure(EngineSpec(model="b"))
    assert started and other.result().name == "b" and loads == ["a", "b"]
    engine = holder.ready()
    holder.close(wait=True)
    assert engine.closed and holder.ready() is None


def test_a_failed_load_falls_back_to_the_defaults_and_says_why():
    said = []

    def load(spec):
        if spec.model == "missing":
            raise ValueError("no model 'missing'")
        return Closable(spec.model)
    holder = EngineHolder(load, say=said.append)
    assert holder.ensure(EngineSpec(model="missing"))[0].result().name is None  # the embedded default
    assert said and "no model 'missing'" in said[0] and "default model" in said[0]
