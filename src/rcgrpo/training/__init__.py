"""Training: the masked LM-head forward, SFT / RCTP-FT, RC-GRPO (grpo/), checkpoints and
multi-process ranks. Imports: bfcl, chat, config, data, fields, models, procs, rollout, runtime."""
