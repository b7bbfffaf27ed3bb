"""The benchmarks' harnesses: clients that type into a real memosight-lsp or llama-server as an
editor would (typing_*, lsp_client, lsp_text, fuzz_stream, llamavim_ring, loopback_http), and the
measures they report (context_measures, replay_breakdown). The `memosight bench ...` commands
(server/commands/bench_*.py) parse the command line and print; what they run lives here."""
