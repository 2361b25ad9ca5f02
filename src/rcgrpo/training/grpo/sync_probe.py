"""The engine serves the policy just trained: after every weight sync the rollout engine and the
trainer score one fixed short sequence, and a gap above `rl.sync_gap_max` fails the step.

Why: the field's most reported silent failure is an engine that keeps sampling an old policy
after a sync (an adapter that never loaded, a stale cache under a reused adapter name, a worker
that missed the new weights) while training "works". A rollout's own log-probs cannot show it:
pi_old is recomputed from the sampled ids, and the engine gap (rollout/logprob_gap) is measured
against weights that were just changed. The probe asks each replica that serves the policy
(every vLLM server, every Ray worker: Engine.score) for log p(ids[t] | ids[:t]) of `PROBE_TEXT`
at temperature 1, and compares them with the trainer's, through the update's own forward
(update.logprobs), position by position:

    sync/logprob_gap  = max over replicas of mean_t |engine log p_t - trainer log p_t|
    sync/policy_drift = mean_t |trainer log p_t now - at the run's first probe|

The drift says what the gap would be on an engine that never took a sync since the start: a
stale engine shows a gap that grows with the drift; a served policy keeps it at the numeric
engine/trainer gap. vLLM computes prompt log-probs without reading its prefix cache, so the
probe checks the weights a server holds; the adapter name's content hash
(rcgrpo.rollout.vllm_served) keeps a cache of earlier weights from being used.

    .venv/bin/pytest tests/test_sync_probe.py -q
"""

from __future__ import annotations

import torch

# a short tool-calling exchange: ordinary text and call syntax, tokenised by the policy's own
# tokenizer (its ids differ per profile; the text is what is fixed)
PROBE_TEXT = (
    "Move report.txt into the archive folder, then list what is left in the current directory."
    ' [mv(source="report.txt", destination="archive"), ls(a=True)]'
)


class StaleEngine(RuntimeError):
    """The rollout engine does not serve the policy the trainer holds (one line: cli USER_ERRORS)."""


def probe_ids(tokenizer) -> list[int]:
    """PROBE_TEXT as token ids, no special tokens added."""
    ids = tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]
    if len(ids) < 2:
        raise ValueError(f"the sync probe needs >= 2 tokens, the tokenizer gave {len(ids)}")
    return list(ids)


def gap(engine: list[list[float]], trainer: torch.Tensor) -> tuple[float, int]:
    """(the largest mean |engine - trainer| over the replicas, that replica's index): engine,
    one (n-1,) list per replica; trainer (n-1,)."""
    means = [float((torch.tensor(lp) - trainer).abs().mean()) for lp in engine]
    worst = max(range(len(means)), key=means.__getitem__)
    return means[worst], worst


class SyncProbe:
    """One run's probe: the fixed ids, the trainer's log-probs at the first probe, the limit."""

    def __init__(self, policy, model, limit: float):
        from rcgrpo.training.grpo.update import logprobs

        self.model, self.limit, self._logprobs = model, limit, logprobs
        self.ids = probe_ids(policy.tokenizer)
        self.start: torch.Tensor | None = None  # (n-1,) the trainer's at the first probe

    @torch.no_grad()
    def trainer(self) -> torch.Tensor:
        """(n-1,) the trainer's log-probs of the probe at temperature 1, in eval mode."""
        ids = torch.tensor([self.ids])
        ones = torch.ones_like(ids)
        was = self.model.training
        self.model.eval()
        try:
            lp, _, _ = self._logprobs(self.model, ids, ones, ones[:, 1:].float(), 1.0)
        finally:
            self.model.train(was)
        return lp[0].float().cpu()

    def __call__(self, engine, step: int) -> dict[str, float]:
        """Score the probe on `engine` and the trainer; the sync/ metrics, or StaleEngine when
        the gap is above the limit (0: never)."""
        mine = self.trainer()
        if self.start is None:
            self.start = mine
        served = engine.score(self.ids)
        worst, replica = gap(served, mine)
        drift = float((mine - self.start).abs().mean())
        if self.limit and not worst <= self.limit:  # NaN fails too
            where = f" (replica {replica} of {len(served)})" if len(served) > 1 else ""
            raise StaleEngine(
                f"the rollout engine does not serve the policy just trained: after the weight "
                f"sync of step {step} its log-probs of the probe sequence differ from the "
                f"trainer's by {worst:.4g} per token{where}, above rl.sync_gap_max = "
                f"{self.limit:g} (the policy moved {drift:.4g} since the start); its rollouts "
                f"would sample another policy: check rollout.engine's weight sync"
            )
        return {"sync/logprob_gap": worst, "sync/policy_drift": drift}
