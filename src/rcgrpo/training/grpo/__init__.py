"""RC-GRPO / GRPO: the algorithm as pure functions (core_algos) and the loop around it (config,
rollouts, update, metrics, trainer, run).
Imports: chat, data, fields, models, rollout, training."""
