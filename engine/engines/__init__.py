"""The engines behind the one door (protocol.py): in process over a runtime (local.py), over HTTP
to a serving engine (remote.py, sse.py), and one that fails on purpose for the tests (faults.py)."""
