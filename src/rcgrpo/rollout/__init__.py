"""Serving rollouts: the token-in-token-out agent loop, the engines (transformers, vLLM server) and
where rollouts run (this process or Ray workers).
Imports: bfcl, chat, fields, models, owned, procs, runtime."""
