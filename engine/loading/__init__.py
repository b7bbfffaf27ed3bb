"""Loading models on this machine: resolving names and files (gguf.py, catalog.py, files.py), torch's
load and its dtype choice (torch_load.py, auto_dtype.py, int8.py), writing a GGUF file
(export_gguf.py), and the machine's own figures (hardware.py, threads.py, memory.py, measured.py)."""
