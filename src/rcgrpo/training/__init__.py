"""Training: the masked LM-head forward, SFT / RCTP-FT, RC-GRPO (grpo/), checkpoints and
multi-process ranks. May import: data, rollout, models, chat, bfcl, runtime, config."""
