"""RCTP-FT and plain SFT: next-token cross-entropy on assistant tokens of recorded trajectories.

* rctp (RCTP-FT): every record of the mixed set, its reward goal (`reward_token`, else high for a
  successful record and low for a failed one) appended to the first user message by the renderer;
* sft (plain SFT): successful records only, no reward goal.

Records are rendered once into token ids + an assistant-only mask by the agent loop's renderer
(rcgrpo.rollout.agent_loop), the same code that renders rollouts, so train and sample see the
same tokens. The loss is summed over assistant tokens and divided by the number of assistant tokens
of the whole optimizer batch, so gradient accumulation over micro-batches gives the gradient of
one big batch; under `accelerate launch` the micro-batches are split between the ranks with the
same normalisation (rcgrpo.training.distributed), so N processes make the 1-process update.
Micro-batches hold `micro_batch_size` examples, or, with `max_tokens_per_micro_batch`, the
batch's examples sorted by length and packed up to that many tokens (rcgrpo.training.batching;
same gradient, far less padding: `train/pad_frac`). LoRA or full fine-tuning is the model
profile's choice (rcgrpo.models.profiles). The batch order is a function of (seed, epoch), so
`resume` continues mid-epoch exactly.

    rcgrpo stage rctp                       # params.yaml `rctp:` + `model:` sections
    rcgrpo stage sft --set epochs=1
    rcgrpo stage rctp --procs 8             # 8 GPUs: ranks of rcgrpo.training.launch's agent
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rcgrpo.chat.record import HIGH, LOW, Trajectory
from rcgrpo.training.forward import with_training_attention
from rcgrpo.training.optim import adamw
from rcgrpo.training.sft_config import SFTConfig

LogMetrics = Callable[[dict, int], None]


def goal_for(record: Trajectory, mode: str) -> str | None:
    """The reward goal a record is trained with (None = no goal text)."""
    if mode == "sft":
        return None
    return record.reward_token or (HIGH if record.reward else LOW)


def select(records: list[Trajectory], mode: str) -> list[Trajectory]:
    """sft trains on successful (expert) records only; rctp on all of them."""
    return [r for r in records if r.reward == 1] if mode == "sft" else list(records)


def batch_schedule(n: int, cfg: SFTConfig) -> list[list[int]]:
    """Example indices of every optimizer step of the run: a seeded permutation per epoch, cut
    into batches (the last batch of an epoch may be smaller)."""
    steps = []
    for epoch in range(cfg.epochs):
        g = torch.Generator().manual_seed(cfg.seed * 1000 + epoch)
        order = torch.randperm(n, generator=g).tolist()
        steps += [order[i : i + cfg.batch_size] for i in range(0, n, cfg.batch_size)]
    return steps


def pad(examples: list[tuple[torch.Tensor, torch.Tensor]], pad_id: int = 0):
    """[(ids (T_i,), mask (T_i,))] -> ids (B, T), assistant mask (B, T), attention (B, T)."""
    T = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(examples), T, dtype=torch.long)
    attn = torch.zeros(len(examples), T, dtype=torch.long)
    for i, (x, m) in enumerate(examples):
        ids[i, : len(x)], mask[i, : len(x)], attn[i, : len(x)] = x, m, 1
    return ids, mask, attn


def summed_ce(model, ids, mask, attn) -> torch.Tensor:
    """Sum of -log p(token) over assistant tokens; the logits at t-1 predict token t, and are
    computed at the assistant positions only (rcgrpo.training.forward.masked_logits)."""
    from rcgrpo.training.forward import masked_logits

    logits, where = masked_logits(model, ids, attn, mask[:, 1:])  # (N, V), (B, T-1)
    return torch.nn.functional.cross_entropy(logits.float(), ids[:, 1:][where], reduction="sum")


def fit(examples: list[tuple[torch.Tensor, torch.Tensor]], max_len: int):
    """The examples of at most max_len tokens (0 = all). Dropped ones are counted in a warning;
    none left, or none with an assistant token, is an error."""
    import warnings

    kept = [e for e in examples if not max_len or len(e[0]) <= max_len]
    if len(kept) < len(examples):
        longest = max(len(x) for x, _ in examples)
        msg = (
            f"SFT: dropped {len(examples) - len(kept)} of {len(examples)} examples longer than "
            f"max_len {max_len} tokens (longest {longest}); raise sft/rctp max_len to keep them"
        )
        if not kept:
            raise ValueError(msg)
        warnings.warn(msg, stacklevel=2)
    if not any(int(m[1:].sum()) for _, m in kept):
        raise ValueError(
            f"SFT: none of the {len(kept)} examples has an assistant token to train on"
        )
    return kept


def lr_lambda(total: int, warmup_ratio: float):
    warm = max(1, math.ceil(total * warmup_ratio)) if warmup_ratio > 0 else 0

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return max(0.0, (total - step) / max(1, total - warm))

    return f


@with_training_attention  # flash-attention where chosen, for the whole loop (no generation here)
def train_sft(
    model: torch.nn.Module,
    examples: list[tuple[torch.Tensor, torch.Tensor]],
    cfg: SFTConfig,
    log_metrics: LogMetrics | None = None,
    resume: bool | str = False,
    pad_id: int = 0,
) -> list[dict]:
    """Fine-tune `model` in place on rendered examples; returns the per-step metrics."""
    from rcgrpo.training import balance, batching, checkpoint, distributed
    from rcgrpo.training.forward import packs
    from rcgrpo.training.run_identity import begin

    if not examples:
        raise ValueError(f"no training examples for mode {cfg.mode!r} in {cfg.data}")
    examples = fit(examples, cfg.max_len)
    torch.manual_seed(cfg.seed)
    params, optimizer = adamw(model, cfg, cfg.weight_decay)
    schedule = batch_schedule(len(examples), cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(len(schedule), cfg.warmup_ratio)
    )
    start = 0
    ckpt, run = begin(cfg.out_dir, dataclasses.asdict(cfg), resume, distributed.is_main())
    if ckpt is not None:
        start = checkpoint.load(ckpt, model, optimizer, scheduler)["step"]
    # under `accelerate launch` each rank takes its share of the micro-batches; else all of them
    ranks = distributed.for_training(model, optimizer, params)
    packed = packs(model)  # flash-attention: a micro-batch is one padding-free row
    coef = balance.model_coef(model)  # attention's weight in the ranks' micro-batch costs
    dev = next(model.parameters()).device  # the rank's GPU under a launcher
    model.train()
    history = []
    for step in range(start, len(schedule)):
        t0 = time.perf_counter()
        batch = [examples[i] for i in schedule[step]]
        n_tokens = sum(int(m[1:].sum()) for _, m in batch)  # assistant targets in the batch
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        lengths = [len(x) for x, _ in batch]
        if cfg.max_tokens_per_micro_batch:  # by tokens, longest first
            groups = batching.micro_batches(lengths, cfg.max_tokens_per_micro_batch, packed)
        else:
            groups = batching.fixed_micro_batches(len(batch), cfg.micro_batch_size)
        micro = [[batch[i] for i in g] for g in groups]
        # the global normalisation (n_tokens of the whole batch) on every rank, summed over them
        mine = ranks.share(micro, [balance.group_cost(lengths, g, packed, coef) for g in groups])
        for k, (mb, weight) in enumerate(mine):
            ids, mask, attn = (t.to(dev) for t in pad(mb, pad_id))
            with ranks.syncing(k, len(mine)):  # forward and backward: DDP arms in forward
                loss = ranks.forward(summed_ce, ids, mask, attn) / max(1, n_tokens) * weight
                ranks.backward(loss)
            total += loss.item()
        (total,) = ranks.sum([total])
        grad_norm = ranks.clip(cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        dt = time.perf_counter() - t0
        seen = sum(len(x) for x, _ in batch)
        metrics = {
            "sft/loss": total,
            "sft/lr": lr,
            "sft/grad_norm": float(grad_norm),
            "sft/epoch": (step + 1) / (len(schedule) / cfg.epochs),
            "sft/tokens_per_s": seen / dt,
            "sft/assistant_tokens": float(n_tokens),
            "sft/step_time_s": dt,
            "train/pad_frac": batching.pad_frac(lengths, groups, packed),
        }
        history.append(metrics)
        if log_metrics is not None and distributed.is_main():
            log_metrics(metrics, step + 1)
        if cfg.save_every and (step + 1) % cfg.save_every == 0 and distributed.is_main():
            checkpoint.save(
                checkpoint.path_for(cfg.out_dir, step + 1),
                model,
                optimizer,
                scheduler,
                step + 1,
                run=run,
            )
    model.eval()
    return history


def render_examples(policy, records: list[Trajectory], cfg: SFTConfig, env):
    """Render the selected records into (ids, assistant mask) pairs with the agent loop's
    renderer, their prompts as `env`'s episodes open them."""
    import dataclasses

    from rcgrpo.rollout.sft_render import render_example

    out = []
    for r in select(records, cfg.mode):
        ex = render_example(dataclasses.replace(r, reward_token=goal_for(r, cfg.mode)), policy, env)
        out.append((torch.tensor(ex.ids), torch.tensor(ex.mask)))
    return out


def check_task_ids(records: list[Trajectory], where, env) -> list[Trajectory]:
    """RecordError in one line if a record names a task `env` does not have (it failed with a
    KeyError after the model had loaded); returns the records."""
    from rcgrpo.chat.record import RecordError

    known = {t.id for split in ("train", "test") for t in env.tasks(split)}
    for number, record in enumerate(records, start=1):
        if record.task_id not in known:
            raise RecordError(f"{where}: record {number}: unknown task id {record.task_id[:80]!r}")
    return records


def run_sft(
    cfg: SFTConfig,
    model_cfg,
    env,
    log_metrics: LogMetrics | None = None,
    log_artifact: Callable[[Path], None] | None = None,
    resume: bool = False,
) -> Path:
    """Load the base policy (rcgrpo.models.loading), fine-tune it on cfg.data (records of
    `env`'s tasks: the run's environment), save it to <out_dir>/final (save_policy: adapter or
    full weights + tokenizer); returns that folder."""
    import dataclasses

    from rcgrpo.chat.record import read_jsonl
    from rcgrpo.models.loading import load_policy, save_policy
    from rcgrpo.models.profiles import PROFILES
    from rcgrpo.rollout import colocate
    from rcgrpo.training import distributed
    from rcgrpo.training.checkpoint import check_writable

    cfg = dataclasses.replace(cfg, max_len=cfg.max_len or PROFILES[model_cfg.profile].sft_max_len)
    check_writable(cfg.out_dir)  # before training: an unwritable out_dir fails in a second
    records = check_task_ids(read_jsonl(cfg.data), cfg.data, env)  # before the model loads
    colocate.trainer_allocator()  # before CUDA initialises: local_device's set_device does
    # under a launcher: this rank's GPU (cuda:LOCAL_RANK), bound before anything loads
    model_cfg = dataclasses.replace(model_cfg, device=distributed.local_device(model_cfg.device))
    policy = load_policy(model_cfg)
    examples = render_examples(policy, records, cfg, env)
    pad_id = policy.tokenizer.pad_token_id or 0
    history = train_sft(policy.model, examples, cfg, log_metrics, resume=resume, pad_id=pad_id)
    final = Path(cfg.out_dir) / "final"
    if not distributed.is_main():  # under `accelerate launch` rank 0 saves (same weights)
        return final
    protocols = sorted({r.protocol for r in select(records, cfg.mode)})
    training = {"stage": cfg.mode, "env": env.name, "protocol": "+".join(protocols)}
    save_policy(policy, final, {**training, "data": cfg.data})
    if history:  # flat {name: number} of the last step, for dvc.yaml `metrics:`
        (Path(cfg.out_dir) / "metrics.json").write_text(json.dumps(history[-1], indent=1) + "\n")
    if log_artifact is not None:
        log_artifact(final)
    return final
