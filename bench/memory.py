"""Benchmark (not a test): peak memory of one RL step, masked LM head vs full logits (issue 10.4).

What: one RL step of rcgrpo.training.grpo.trainer on the `qwen-shape` profile (Qwen2.5's 152,064-row
padded vocabulary and untied head on a tiny Qwen2, LoRA as the 7B profile), one sequence of
2k / 4k / 8k tokens with ~10 % of the positions sampled (loss mask 1, in 64-token assistant
turns, as in tool-calling data): pi_old and reference log-probs (no grad), then forward +
backward of the PPO/KL loss with the entropy metric. Two paths:
  new  the trainer as it is: Trainer._logprobs / _ref_logprobs (LM head at the N sampled
       positions only, (N, V); entropy on those; reference = a frozen second LoRA adapter)
  old  the path before issue 10, kept here as the reference: logits (B, T-1, V) at every
       position, entropy over all of them, reference = copy.deepcopy of the whole PeftModel.
How: each (path, length) runs in its own subprocess: load the policy, reset the peak-RSS mark
(`5` > /proc/self/clear_refs), take VmRSS as the baseline, run the step, read VmHWM from
/proc/self/status; printed = VmHWM - baseline (the reference model or adapter is built after
the baseline, so it counts). A child gets an address-space limit of the free memory minus 2 GB
(RLIMIT_AS, set after the load, as growth beyond the loaded size): on a box too small for the old path at 8k it fails with "out of memory" instead of
starving the other processes, and the table shows the limit as a lower bound (">") of its peak.
Last line: the ratio new/old at 8k (target <= 0.25). Then an estimate, with its arithmetic, for
Qwen2.5-7B + LoRA at the paper's batch on one 141 GB GPU.

    .venv/bin/python bench/memory.py                          # 2048,4096,8192 (~2-4 min, ~20 GB)
    .venv/bin/python bench/memory.py --lengths 1024,2048      # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
V = 152_064  # Qwen2.5's padded vocabulary (qwen-shape has the same)
GB = 1e9


def status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


def batch(T: int, frac: float):
    """ids (1, T), attention (1, T), loss mask (1, T-1): assistant turns of 64 tokens spaced
    so that ~frac of the positions are sampled."""
    import torch

    g = torch.Generator().manual_seed(T)
    ids = torch.randint(0, 151_643, (1, T), generator=g)
    mask = torch.zeros(1, T - 1)
    period = int(64 / frac)
    for start in range(period - 64, T - 1, period):
        mask[0, start : start + 64] = 1
    return ids, torch.ones_like(ids), mask


def old_logprobs(model, ids, attn):
    """The pre-issue-10 Trainer._logprobs: full logits (B, T-1, V) (temperature 1)."""
    from rcgrpo.training.grpo.core_algos import token_logprobs

    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    return token_logprobs(logits, ids[:, 1:]), logits


def child(path: str, T: int, frac: float) -> dict:
    import copy

    import torch

    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.training.forward import scatter
    from rcgrpo.training.grpo.core_algos import policy_loss, token_entropy
    from rcgrpo.training.grpo.trainer import RLConfig, Trainer

    torch.manual_seed(0)
    policy = load_policy(ModelConfig(profile="qwen-shape"))
    model = policy.model.eval()
    ids, attn, mask = batch(T, frac)
    sampled = torch.zeros_like(mask)
    adv = torch.tensor([1.0])
    # address space may grow by at most `limit` from here: RSS (touched pages) grows less
    grow = int(os.environ["RCGRPO_BENCH_LIMIT"])
    size = status_kb("VmSize") * 1024
    resource.setrlimit(resource.RLIMIT_AS, (size + grow, size + grow))
    Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
    base = status_kb("VmRSS")
    if path == "new":
        trainer = Trainer(policy, None, [], RLConfig(), temperature=1.0)  # + reference adapter
        with torch.no_grad():
            old, logits, where = trainer._logprobs(model, ids, attn, mask)
            gap = ((sampled - old).abs() * mask).sum()
            ref = trainer._ref_logprobs(ids, attn, mask)
        del logits
        model.train()
        logp, logits, where = trainer._logprobs(model, ids, attn, mask)
        entropy = scatter(token_entropy(logits.detach()), where)
    else:
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)  # the old reference
        with torch.no_grad():
            old, logits = old_logprobs(model, ids, attn)
            gap = ((sampled - old).abs() * mask).sum()
            del logits
            ref = old_logprobs(ref_model, ids, attn)[0]
        model.train()
        logp, logits = old_logprobs(model, ids, attn)
        entropy = token_entropy(logits.detach())
    loss, stats = policy_loss(logp, old, adv, mask, ref, entropy=entropy)
    loss.backward()
    return {"peak_gb": (status_kb("VmHWM") - base) * 1024 / GB, "loss": loss.item(),
            "entropy": stats["entropy"], "gap": float(gap), "sampled": int(mask.sum())}  # fmt: skip


def measure(path: str, T: int, frac: float, threads: int) -> dict:
    avail = status_available()
    limit = max(avail - 2 * GB, GB)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "OMP_NUM_THREADS": str(threads),
           "RCGRPO_BENCH_LIMIT": str(int(limit))}  # fmt: skip
    run = subprocess.run(
        [sys.executable, __file__, "--child", path, str(T), str(frac)],
        capture_output=True, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("{")]
    if run.returncode == 0 and lines:
        return json.loads(lines[-1])
    tail = (run.stderr.strip().splitlines() or ["?"])[-1]
    if "memory" in run.stderr.lower() or run.returncode in (-9, 137):
        return {"oom_gb": limit / GB, "error": tail}
    raise RuntimeError(f"{path} at {T} tokens failed: {tail}")


def status_available() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0.0


def estimate(frac: float) -> None:
    """Qwen2.5-7B-Instruct + LoRA r=16 (all 7 projections), bf16, one 141 GB GPU."""
    d, inter, kv, layers, params = 3584, 18944, 512, 28, 7.62e9
    T, micro = 8192, 8  # sequence, rollouts per forward (paper batch: 256 tasks x G=5 = 1280
    # rollouts, mini-batch 64 tasks = 320 rollouts = 40 micro-batches of 8 per optimizer step;
    # gradient accumulation, so only the micro-batch sets the activation peak)
    tokens, n = micro * T, int(micro * T * frac)
    lora = layers * 16 * (2 * (d + d) + 2 * (d + kv) + 3 * (d + inter))  # r * (in + out)
    w = params * 2
    opt = lora * 4 * 4  # fp32 weights, grads, Adam m and v
    ref = lora * 4  # the frozen reference adapter (fp32)
    ckpt = layers * tokens * d * 2  # checkpointing keeps each layer's bf16 input
    layer = tokens * (4 * d + 2 * kv + 3 * inter) * 2  # one layer recomputed: q,k,v,o,attn
    # out, gate/up/act (SDPA/flash attention: no T x T matrix)
    per_logits = 4 * V * 4  # 4 fp32 (., V) copies per position: what the qwen-shape run measures
    rows = [
        ("weights bf16 (7.62e9 x 2 B)", w, w),
        (f"LoRA {lora / 1e6:.1f}M params x 16 B (fp32 w, grad, Adam m, v)", opt, opt),
        ("reference: frozen adapter (new) / deepcopy of the model (old)", ref, w + ref),
        (f"activations, checkpointed: {layers} x {tokens} tok x {d} x 2 B", ckpt, ckpt),
        (f"one layer recomputed in backward: {tokens} tok x {4 * d + 2 * kv + 3 * inter} x 2 B",
         layer, layer),
        (f"logits: {n} masked / {tokens} positions x {V} x 4 B x 4 copies",
         n * per_logits, tokens * per_logits),
    ]  # fmt: skip
    print(f"\nEstimate: Qwen2.5-7B + LoRA, micro-batch {micro} x {T} tokens, {frac:.0%} sampled")
    print(f"  {'term':<72} {'new GB':>8} {'old GB':>8}")
    for name, new, old in rows:
        print(f"  {name:<72} {new / GB:8.1f} {old / GB:8.1f}")
    new, old = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"  {'total (one 141 GB H200)':<72} {new / GB:8.1f} {old / GB:8.1f}")
    nockpt = layers * layer
    print(f"  without checkpointing the activations alone: {layers} x {layer / GB:.1f} = "
          f"{nockpt / GB:.0f} GB")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="2048,4096,8192", help="sequence lengths, tokens")
    ap.add_argument("--mask-frac", type=float, default=0.1, help="share of sampled positions")
    ap.add_argument("--threads", type=int, default=2, help="torch threads per child")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        import torch

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
        print(json.dumps(child(args.child[0], int(args.child[1]), float(args.child[2]))))
        return
    lengths = [int(x) for x in args.lengths.split(",")]
    print(f"qwen-shape, 1 sequence, {args.mask_frac:.0%} sampled; threads {args.threads}; "
          f"load {os.getloadavg()}; MemAvailable {status_available() / GB:.1f} GB")  # fmt: skip
    print(f"{'tokens':>7} {'sampled':>7} {'new GB':>8} {'old GB':>8} {'new/old':>8}   "
          "peak in fp32 logits copies: new (N x V), old (T x V)")  # fmt: skip
    ratio = {}
    for T in lengths:
        new = measure("new", T, args.mask_frac, args.threads)
        old = measure("old", T, args.mask_frac, args.threads)
        if "oom_gb" in new:
            raise RuntimeError(f"the new path ran out of memory at {T} tokens: {new['error']}")
        if "oom_gb" in old:
            old_txt, ratio[T] = f">{old['oom_gb']:.1f}", f"< {new['peak_gb'] / old['oom_gb']:.3f}"
        else:
            assert abs(new["loss"] - old["loss"]) < 1e-4, (new, old)  # the same step
            old_txt, ratio[T] = f"{old['peak_gb']:.2f}", f"{new['peak_gb'] / old['peak_gb']:.3f}"
        copies = f"{new['peak_gb'] * GB / (new['sampled'] * V * 4):.2f}"
        if "peak_gb" in old:  # what the estimate's "4 copies" per position rests on
            copies += f", {old['peak_gb'] * GB / (T * V * 4):.2f}"
        print(f"{T:>7} {new['sampled']:>7} {new['peak_gb']:>8.2f} {old_txt:>8} {ratio[T]:>8}   "
              f"{copies}")  # fmt: skip
    print(f"load after: {os.getloadavg()}")
    estimate(args.mask_frac)
    last = max(lengths)
    print(f"ratio new/old peak memory at {last} tokens: {ratio[last]} (target <= 0.25)")


if __name__ == "__main__":
    main()
