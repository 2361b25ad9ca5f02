"""The paper's four training recipes (Table 1) as settings of the same two stages.

Each variant is a fine-tuning stage (`init`: plain SFT on experts, or RCTP-FT on the 1:1 mixed
set) followed by RL with or without reward conditioning, and the reward goal it is evaluated
under. Fair as the paper ran them:

    variant        init  RL prompts                         evaluated with (first = headline)
    sft+grpo       sft   no goal (plain GRPO)               none
    sft+rc-grpo    sft   sampled goal, P(high) = p          none, high, low
    rctp+grpo      rctp  always <|high_reward|>, P(high)=1  high, low
    rctp+rc-grpo   rctp  sampled goal, P(high) = p          high, low

RCTP+GRPO keeps the goal in every prompt (the RCTP model never saw a goal-free prompt), so it
differs from RCTP+RC-GRPO only in never drawing <|low_reward|>. SFT-initialised runs are scored
without a goal, the prompts their fine-tuning saw; an SFT+RC-GRPO model is also scored under
high/low, beside it, for its controllability gap.

    rcgrpo run --variant sft+grpo          # the pipeline with one of them (params.yaml: rctp+rc-grpo)
    .venv/bin/python bench/learning.py     # all four, same start, same rollout budget, 3 seeds
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    name: str
    init: str  # fine-tuning stage RL starts from: "sft" | "rctp"
    conditioning: str  # RL prompts: "none" (no goal) | "rc" (a goal drawn per rollout)
    p_high: float | None  # P(<|high_reward|>) per rollout; None = rl.p_high (the paper's 0.5)
    eval_tokens: tuple[str, ...]  # reward goals to evaluate under; the first is the headline

    def rl_overrides(self) -> dict:
        """The `rl:` fields this variant fixes (on top of params.yaml / other overrides)."""
        out = {"init": self.init, "conditioning": self.conditioning}
        if self.p_high is not None:
            out["p_high"] = self.p_high
        return out


VARIANTS = {
    v.name: v
    for v in (
        Variant("sft+grpo", "sft", "none", None, ("none",)),
        Variant("sft+rc-grpo", "sft", "rc", None, ("none", "high", "low")),
        Variant("rctp+grpo", "rctp", "rc", 1.0, ("high", "low")),
        Variant("rctp+rc-grpo", "rctp", "rc", None, ("high", "low")),
    )
}


def get_variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}: pick one of {sorted(VARIANTS)}")
    return VARIANTS[name]


def recipe(rl) -> Variant:
    """The paper's recipe an `rl:` section amounts to (init, conditioning, p_high): its Variant,
    else one named after those fields (not one of the paper's four), evaluated under the goals
    it was trained with. What `rcgrpo run` reports and tags as the run's variant."""
    for v in VARIANTS.values():
        p_matches = rl.p_high == v.p_high if v.p_high is not None else rl.p_high != 1.0
        if (rl.init, rl.conditioning) == (v.init, v.conditioning) and p_matches:
            return v
    if rl.conditioning == "none":
        return Variant(f"{rl.init}+grpo (no goal)", rl.init, "none", None, ("none",))
    return Variant(f"{rl.init}+rc-grpo (p_high {rl.p_high:g})", rl.init, "rc", rl.p_high, ("high",))
