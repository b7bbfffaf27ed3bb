"""The JSON-RPC layer: frames in and out within bounds (framing.py), and a connection that
dispatches each message to its handler and answers every request once (connection.py). It knows
nothing of completions."""
