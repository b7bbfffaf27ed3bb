"""Decoding: the speculative step and the plain greedy loop beside it (speculate.py), the draft tree
and its verification (verify.py), how many nodes a pass pays for (sizing.py), the torch runtime's
KV caches (kv.py), and the attention a model pays to the lines above a cursor (attention.py)."""
