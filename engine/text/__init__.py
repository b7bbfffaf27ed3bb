"""Text rules: fill-in-the-middle prompts (fim.py), token healing (healing.py), and where a
completion stops as it streams (stops.py)."""
