"""Training: the masked LM-head forward, SFT / RCTP-FT, RC-GRPO (grpo/), checkpoints and
multi-process ranks. Imports: chat, data, fields, models, rollout, runtime."""
