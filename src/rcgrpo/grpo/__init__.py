"""RC-GRPO: reward-token sampling, group advantages and the clipped policy loss (core_algos, pure)
and the RL loop that uses them (trainer)."""
