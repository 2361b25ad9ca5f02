"""GPU check of rollout.engine=vllm: the CPU parity test's checks and one RC-GRPO step, < 5 min.

On a machine with CUDA (nvidia-smi) and the project's venv: builds .venv-vllm with PyPI `vllm`
(scripts/vllm_venv.sh picks the CUDA build there; minutes, once), loads the tiny model with LoRA
on the GPU, starts one vLLM server and prints, each with its time:
1. greedy parity: ids and calls of the HF and vLLM engines on --episodes episodes (equal / not);
2. sampled log-probs (T = 1) against a training forward pass: max |gap| (target < 1e-4 fp32);
3. an adapter update (LoRA B moved, runtime /v1/load_lora_adapter): outputs changed, and equal
   the HF engine's on the updated weights;
4. one RC-GRPO step (rcgrpo.training.grpo.trainer.Trainer) through the vLLM engine: reward, the
   rollout/logprob_gap the trainer logs, rollout/sync seconds.
Exit status 1 if a check fails.

    .venv/bin/python scripts/gpu_vllm_check.py                 # GPU machine
    .venv/bin/python scripts/gpu_vllm_check.py --device cpu    # the same on the CPU (slower)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def main() -> int:
    from rcgrpo.envs.bfcl.environment import BFCL

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="torch device of the policy")
    parser.add_argument("--episodes", type=int, default=8, help="episodes in the parity checks")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="per model message")
    args = parser.parse_args()

    import torch

    from rcgrpo.bfcl.tasks import tasks_in
    from rcgrpo.chat.record import HIGH, LOW
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.rollout.execution import make_engine
    from rcgrpo.runtime import apply_defaults
    from rcgrpo.training.grpo.config import RLConfig
    from rcgrpo.training.grpo.trainer import Trainer

    apply_defaults()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu, or on a GPU machine", file=sys.stderr)
        return 2
    t_all, ok = time.perf_counter(), True
    print(f"device {args.device}, load average {os.getloadavg()[0]:.2f}, threads "
          f"{torch.get_num_threads()}")  # fmt: skip
    policy = load_policy(ModelConfig(profile="tiny", lora=True, lora_r=8, device=args.device))
    tasks = tasks_in("train")[:: 720 // args.episodes][: args.episodes]
    tokens = [HIGH, LOW] * (len(tasks) // 2) + [HIGH] * (len(tasks) % 2)
    greedy = RolloutConfig(temperature=0.0, max_new_tokens=args.max_new_tokens,
                           max_total_tokens=1200, max_batch=64)  # fmt: skip
    t0 = time.perf_counter()
    vllm = make_engine(RolloutConfig(**{**greedy.__dict__, "engine": "vllm",
                                        "vllm_max_lora_rank": 8}), policy, BFCL)  # fmt: skip
    print(f"vllm server up in {time.perf_counter() - t0:.1f} s (venv ready, export, /health)")
    try:

        def parity(label):
            from rcgrpo.envs.bfcl.environment import BFCL

            nonlocal ok
            t = time.perf_counter()
            hf = make_engine(greedy, policy, BFCL).rollout(tasks, tokens, seed=0)
            t_hf = time.perf_counter() - t
            t = time.perf_counter()
            vl = vllm.rollout(tasks, tokens, seed=0)
            t_vl = time.perf_counter() - t
            same = [r.ids for r in vl] == [r.ids for r in hf]
            same_calls = [r.calls for r in vl] == [r.calls for r in hf]
            ok &= same and same_calls
            n = sum(r.n_sampled for r in vl)
            print(f"{label}: greedy ids equal {same}, calls equal {same_calls} ({len(tasks)} "
                  f"episodes, {n} tokens; hf {t_hf:.1f} s, vllm {t_vl:.1f} s)")  # fmt: skip
            return vl

        before = parity("1. base")
        from dataclasses import replace

        vllm.cfg = replace(vllm.cfg, temperature=1.0)
        sampled = vllm.rollout(tasks, tokens, seed=5)
        vllm.cfg = replace(vllm.cfg, temperature=0.0)
        worst = 0.0
        for r in sampled:
            ids = torch.tensor([r.ids], device=args.device)
            with torch.no_grad():
                logits = policy.model(input_ids=ids).logits[0].float()
            logp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None])[:, 0].cpu()
            mask = torch.tensor(r.mask[1:], dtype=torch.bool)
            worst = max(worst, float((torch.tensor(r.logprobs[1:])[mask] - logp[mask]).abs().max()))
        ok &= worst < 1e-4
        print(f"2. sampled log-probs vs trainer forward: max |gap| {worst:.2e} (target < 1e-4)")
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, p in policy.model.named_parameters():
                if "lora_B" in name:
                    p.add_((torch.randn(p.shape, generator=gen) * 0.3).to(p))
        vllm.sync(policy)
        after = parity(f"3. adapter v{vllm.version} (sync {vllm.sync_seconds[-1] * 1e3:.0f} ms)")
        changed = [r.ids for r in after] != [r.ids for r in before]
        ok &= changed
        print(f"   outputs changed by the adapter update: {changed}")

        vllm.cfg = replace(vllm.cfg, temperature=1.0)
        cfg = RLConfig(steps=1, tasks_per_step=2, group_size=4, tasks_from="", save_every=0,
                       out_dir=tempfile.mkdtemp(prefix="rcgrpo-gpu-check-"))  # fmt: skip
        t = time.perf_counter()
        metrics = Trainer(
            policy, vllm, tasks_in("train")[:8], cfg, BFCL.scorer(cfg.protocol)
        ).train_step(0)
        gap = metrics["rollout/logprob_gap"]
        ok &= gap < 1e-4
        print(f"4. one RC-GRPO step through vllm in {time.perf_counter() - t:.1f} s: reward "
              f"{metrics['reward/mean']:.3f}, rollout/logprob_gap {gap:.2e}, sync "
              f"{vllm.sync_seconds[-1] * 1e3:.0f} ms, adapter v{vllm.version}")  # fmt: skip
    finally:
        vllm.close()
    print(f"{'PASS' if ok else 'FAIL'} in {time.perf_counter() - t_all:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
