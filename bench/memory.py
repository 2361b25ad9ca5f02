"""Benchmark (not a test): peak memory of one RL step, masked LM head vs full logits.

What: one RL step of rcgrpo.training.grpo.trainer on the `qwen-shape` profile (Qwen2.5's 152,064-row
padded vocabulary and untied head on a tiny Qwen2, LoRA as the 7B profile), one sequence of
2k / 4k / 8k tokens with ~10 % of the positions sampled (loss mask 1, in 64-token assistant
turns, as in tool-calling data): pi_old and reference log-probs (no grad), then forward +
backward of the PPO/KL loss with the entropy metric. Two paths:
  new  the trainer as it is: Trainer._logprobs / _ref_logprobs (LM head at the N sampled
       positions only, (N, V); entropy on those; reference = a frozen second LoRA adapter)
  old  the earlier full-logits path, kept here as the reference: logits (B, T-1, V) at every
       position, entropy over all of them, reference = copy.deepcopy of the whole PeftModel.
How: each (path, length) runs in its own subprocess: load the policy, reset the peak-RSS mark
(`5` > /proc/self/clear_refs), take VmRSS as the baseline, run the step, read VmHWM from
/proc/self/status; printed = VmHWM - baseline (the reference model or adapter is built after
the baseline, so it counts). A child gets an address-space limit of the free memory minus 2 GB
(RLIMIT_AS, set after the load, as growth beyond the loaded size): on a box too small for the old path at 8k it fails with "out of memory" instead of
starving the other processes, and the table shows the limit as a lower bound (">") of its peak.
Last line: the ratio new/old at 8k (target <= 0.25). Then the same arithmetic as `rcgrpo plan`
(rcgrpo.training.plan.memory) for Qwen2.5-7B + LoRA at a micro-batch of 8 x 8k tokens.

--mix: one RL update (pi_old + reference log-probs, then forward + backward of the
PPO/KL loss and the optimizer step, through rcgrpo.training.grpo.update) of 8 qwen-shape rollouts
of a length mix like the four categories: each category's median and p95 episode length of the
7B profiles (the 800 ground truths replayed), divided by --scale to fit the 24 GB box, 3.3 % of
each sampled. Two paths in one run, each in its own process:
  budget  token-budget micro-batches: sorted by length and packed up to --max-tokens computed
          tokens (default: the longest rollout, which runs alone anyway), trimmed to their
          longest member, no attention mask (SDPA's causal kernels)
  padded  today's path: one micro-batch of the 8 (micro_batch_size 8) padded to the longest,
          with its attention mask (a dense (8, 1, T, T) mask under SDPA) and the default KV
          cache of an eval-mode forward
Both must give the same loss (1e-4). It also prints what rcgrpo.training.plan.memory (the
formula of `rcgrpo plan`) predicts for the budget path's peak and measured / predicted.
Last line: the ratio token-budget / padded peak memory (target <= 0.5).

--shares: the same step as the first mode at one length as the sampled share grows (3 % -> 50 %:
a policy writing long messages), the chunked LM head (rcgrpo.training.grpo.head, --chunk rows
at once) against the same head in one piece. Last line: peak at the largest share / smallest.

    .venv/bin/python bench/memory.py                          # 2048,4096,8192 (~2-4 min, ~20 GB)
    .venv/bin/python bench/memory.py --lengths 1024,2048      # a quick look
    .venv/bin/python bench/memory.py --mix                    # the length mix (~2-4 min, ~12 GB)
    .venv/bin/python bench/memory.py --shares 0.03,0.5 --lengths 4096 --chunk 128  # LM head
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
    """The earlier Trainer._logprobs: full logits (B, T-1, V) (temperature 1)."""
    from rcgrpo.training.grpo.core_algos import token_logprobs

    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    return token_logprobs(logits, ids[:, 1:]), logits


def child(path: str, T: int, frac: float) -> dict:
    import copy

    import torch

    from rcgrpo.envs.bfcl.environment import BFCL
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.training.forward import scatter
    from rcgrpo.training.grpo.config import RLConfig
    from rcgrpo.training.grpo.core_algos import policy_loss, token_entropy
    from rcgrpo.training.grpo.trainer import Trainer

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
    if path in ("new", "unchunked"):
        from rcgrpo.training.grpo import head

        head.CHUNK = (
            10**9
            if path == "unchunked"
            else int(os.environ.get("RCGRPO_BENCH_CHUNK", 0)) or head.CHUNK
        )
        trainer = Trainer(
            policy, None, [], RLConfig(), BFCL.scorer(), temperature=1.0
        )  # + reference adapter
        with torch.no_grad():
            old, _, where = trainer._logprobs(model, ids, attn, mask)
            gap = ((sampled - old).abs() * mask).sum()
            ref = trainer._ref_logprobs(ids, attn, mask)
        model.train()
        logp, head_out, where = trainer._logprobs(model, ids, attn, mask)
        entropy = scatter(head_out.entropy, where)
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


def measure(path: str, T: int, frac: float, threads: int, child_args=None, chunk: int = 0) -> dict:
    avail = status_available()
    limit = max(avail - 2 * GB, GB)
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
        "OMP_NUM_THREADS": str(threads),
        "RCGRPO_BENCH_LIMIT": str(int(limit)),
        "RCGRPO_BENCH_CHUNK": str(chunk),
    }
    if chunk:  # --shares: a fixed mmap threshold, or glibc's moving one keeps freed chunks in RSS
        env["MALLOC_MMAP_THRESHOLD_"] = str(1 << 20)
    child_args = child_args or ["--child", path, str(T)]
    run = subprocess.run(
        [sys.executable, __file__, *child_args, "--mask-frac", str(frac)],
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
    """Qwen2.5-7B-Instruct + LoRA r=16 (all 7 projections), bf16, gradient checkpointing, one
    micro-batch of 8 x 8k tokens: the terms `rcgrpo plan` prints (rcgrpo.training.plan.memory)."""
    from rcgrpo.models.profiles import LORA_TARGETS
    from rcgrpo.training.plan.constants import architecture
    from rcgrpo.training.plan.memory import measured_layer, static_terms, update_terms

    arch, tokens = architecture("qwen2.5-7b-instruct"), 8 * 8192
    lora = arch.lora_params(16, LORA_TARGETS["qwen2"])
    layer = measured_layer("qwen2.5-7b-instruct", "bfloat16")
    terms = static_terms(arch, 2, lora, 1, True) + update_terms(
        arch, tokens, int(frac * tokens), 2, True, layer
    )
    print(f"\nEstimate (rcgrpo.training.plan.memory): Qwen2.5-7B + LoRA, 8 x 8,192 tokens, "
          f"{frac:.0%} sampled")  # fmt: skip
    for t in terms:
        print(f"  {t.name:<52} {t.bytes / GB:8.1f} GB   {t.formula}")
    print(
        f"  {'total':<52} {sum(t.bytes for t in terms) / GB:8.1f} GB   (rcgrpo plan adds the "
        "context, the allocator slack and vLLM)"
    )


# --- the length mix ------------------------------------------------------------
# 7B-profile episode tokens per category, (median, p95): the 800 ground truths replayed with
# the qwen-shape tokenizer, combined protocol (src/rcgrpo/training/plan/episodes.json)
MIX = {"base": (6144, 8029), "miss_func": (6144, 8029), "miss_param": (6150, 8038),
       "long_context": (9174, 42753)}  # fmt: skip


def mix_lengths(scale: float) -> list[int]:
    return [max(64, int(t / scale)) for pair in MIX.values() for t in pair]


def rollout(T: int, frac: float, seed: int):
    """A synthetic rollout of T tokens: random ids, 64-token sampled turns spaced so that
    ~frac of the positions are sampled, the first 256 tokens a prompt."""
    from types import SimpleNamespace

    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 151_643, (T,), generator=g).tolist()
    mask, period = [0] * T, max(65, int(64 / frac))
    for start in range(min(256, T - 65), T - 64, period):
        mask[start : start + 64] = [1] * 64
    return SimpleNamespace(ids=ids, loss_mask=mask, logprobs=[0.0] * T)


def old_padded_logprobs(model, ids, attn, mask):
    """The padded path's update.logprobs: the decoder with the attention mask (dense under SDPA) and the
    default cache, then the head at the sampled positions (temperature 1)."""
    from rcgrpo.training.forward import scatter
    from rcgrpo.training.grpo.core_algos import token_entropy, token_logprobs
    from rcgrpo.training.grpo.head import Sampled

    where = mask.bool()
    hidden = model.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state
    logits = model.get_output_embeddings()(hidden[:, :-1][where]).float()
    logp = token_logprobs(logits, ids[:, 1:][where])
    sampled = Sampled(token_entropy(logits.detach()), logp.detach())
    return scatter(logp, where), sampled, where


def mix_child(path: str, lengths: list[int], frac: float, budget: int) -> dict:
    import torch

    from rcgrpo.envs.bfcl.environment import BFCL
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.lora import using_adapter
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.training.batching import computed_tokens
    from rcgrpo.training.grpo import update
    from rcgrpo.training.grpo.config import RLConfig
    from rcgrpo.training.grpo.core_algos import minibatch_indices
    from rcgrpo.training.grpo.trainer import Trainer

    torch.manual_seed(0)
    policy = load_policy(ModelConfig(profile="qwen-shape"))
    model = policy.model.eval()
    batch = update.to_batch([rollout(T, frac, i) for i, T in enumerate(lengths)])
    adv = torch.tensor([1.0, -1.0] * (len(lengths) // 2))
    cfg = RLConfig(tasks_per_step=len(lengths) // 2, group_size=2, micro_batch_size=len(lengths),
                   max_tokens_per_micro_batch=budget if path == "budget" else 0)  # fmt: skip
    passes = minibatch_indices(len(lengths), 0, len(lengths), 1, None, lengths,
                               cfg.max_tokens_per_micro_batch)  # fmt: skip
    grow = int(os.environ["RCGRPO_BENCH_LIMIT"])
    size = status_kb("VmSize") * 1024
    resource.setrlimit(resource.RLIMIT_AS, (size + grow, size + grow))
    Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
    base = status_kb("VmRSS")
    trainer = Trainer(
        policy, None, [], cfg, BFCL.scorer(cfg.protocol), temperature=1.0
    )  # + reference adapter, AdamW
    if path == "budget":
        logprob_fn, ref_fn = trainer._logprobs, trainer._ref_logprobs
    else:
        logprob_fn = old_padded_logprobs

        def ref_fn(ids, attn, mask):
            with using_adapter(model, trainer.ref_adapter):
                return old_padded_logprobs(model, ids, attn, mask)[0]

    first = [c for mini in passes[0] for c in mini]
    old, ref, _ = update.behaviour_logprobs(model, batch, first, logprob_fn, 1.0, ref_fn)
    ups = update.ppo_updates(model, trainer.optimizer, trainer.ranks, batch, old, ref, adv,
                             passes, cfg, logprob_fn)  # fmt: skip
    micro = [[computed_tokens(lengths, c.tolist()), int(batch.mask[c].sum())] for c in first]
    return {"peak_gb": (status_kb("VmHWM") - base) * 1024 / GB, "loss": ups[0]["total"],
            "micro": micro}  # fmt: skip


def predicted(micro: list[list[int]]) -> tuple[float, str]:
    """What rcgrpo.training.plan.memory predicts for one update over these micro-batches
    ([computed tokens, sampled] each) on qwen-shape in fp32: the trainable state and the
    reference (static_terms without the weights, loaded before the baseline) plus the largest
    micro-batch's activations and logits (update_terms)."""
    from rcgrpo.models.profiles import LORA_TARGETS
    from rcgrpo.training.plan.constants import architecture
    from rcgrpo.training.plan.memory import measured_layer, static_terms, update_terms

    arch, layer = architecture("qwen-shape"), measured_layer("qwen-shape", "float32")
    lora = arch.lora_params(16, LORA_TARGETS["qwen2"])
    static = sum(t.bytes for t in static_terms(arch, 4, lora, 1, True)[1:])

    def terms_of(m):
        return update_terms(arch, m[0], m[1], 4, False, layer)

    peak = max(micro, key=lambda m: sum(t.bytes for t in terms_of(m)))
    terms = terms_of(peak)
    text = ", ".join(f"{t.name.split(',')[0].split(' (')[0]} {t.bytes / GB:.2f}" for t in terms)
    return (static + sum(t.bytes for t in terms)) / GB, f"static {static / GB:.3f} + {text}"


def run_mix(args) -> None:
    lengths = mix_lengths(args.scale)
    budget = args.max_tokens or max(lengths)
    print(f"qwen-shape, 8 rollouts of {lengths} tokens (the four categories' median and p95 / "
          f"{args.scale:g}), {args.mask_frac:.1%} sampled, token budget {budget:,}; threads "
          f"{args.threads}; load {os.getloadavg()}; MemAvailable {status_available() / GB:.1f} GB")  # fmt: skip
    res = {}
    for path in ("budget", "padded"):
        res[path] = measure(path, 0, args.mask_frac, args.threads,
                            ["--mix-child", path, ",".join(map(str, lengths)), str(budget)])  # fmt: skip
        if "oom_gb" in res[path]:
            raise RuntimeError(f"the {path} path ran out of memory: {res[path]['error']}")
        micro = res[path]["micro"]
        computed = sum(m[0] for m in micro)
        print(f"  {path:<7} peak {res[path]['peak_gb']:6.2f} GB   {len(micro)} micro-batch(es), "
              f"computed tokens {[m[0] for m in micro]}, pad_frac {1 - sum(lengths) / computed:.3f}")  # fmt: skip
    assert abs(res["budget"]["loss"] - res["padded"]["loss"]) < 1e-4, res  # the same update
    pred, how = predicted(res["budget"]["micro"])
    print(f"  plan formula (rcgrpo.training.plan.memory) for the budget path: {pred:.2f} GB "
          f"({how}); measured / predicted: {res['budget']['peak_gb'] / pred:.2f}")  # fmt: skip
    print(f"load after: {os.getloadavg()}")
    ratio = res["budget"]["peak_gb"] / res["padded"]["peak_gb"]
    print(f"token-budget/padded peak memory: {ratio:.3f} (target <= 0.5)")


def run_shares(args) -> None:
    """--shares: one RL step's peak as the sampled share grows, the chunked LM head
    (rcgrpo.training.grpo.head) against the same head unchunked (one (N, V) at once)."""
    T, shares = int(args.lengths.split(",")[0]), [float(x) for x in args.shares.split(",")]
    print(
        f"qwen-shape, 1 sequence of {T:,} tokens, head chunk {args.chunk or 'head.CHUNK'}; "
        f"threads {args.threads}; MemAvailable {status_available() / GB:.1f} GB"
    )
    print(f"{'share':>6} {'sampled':>8} {'chunked GB':>11} {'unchunked GB':>13}")
    peak = {}
    for share in shares:
        got = {
            p: measure(p, T, share, args.threads, chunk=args.chunk) for p in ("new", "unchunked")
        }
        if "oom_gb" in got["new"]:
            raise RuntimeError(f"the chunked head ran out of memory: {got['new']['error']}")
        un = got["unchunked"]
        un_txt = f">{un['oom_gb']:.1f}" if "oom_gb" in un else f"{un['peak_gb']:.2f}"
        if "loss" in un:
            assert abs(got["new"]["loss"] - un["loss"]) < 1e-5, got  # the same step
        peak[share] = (got["new"]["peak_gb"], un.get("peak_gb", un.get("oom_gb")))
        print(
            f"{share:>6.2f} {got['new']['sampled']:>8} {got['new']['peak_gb']:>11.2f} {un_txt:>13}"
        )
    lo, hi = min(shares), max(shares)
    print(
        f"chunked peak {hi:.0%}/{lo:.0%} share: {peak[hi][0] / peak[lo][0]:.2f} (target <= 1.1); "
        f"unchunked: {peak[hi][1] / peak[lo][1]:.2f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="2048,4096,8192", help="sequence lengths, tokens")
    ap.add_argument(
        "--mask-frac",
        type=float,
        default=None,
        help="share of sampled positions (default 0.1; --mix: 0.033)",
    )
    ap.add_argument("--threads", type=int, default=2, help="torch threads per child")
    ap.add_argument("--mix", action="store_true", help="the length mix: budget vs padded")
    ap.add_argument("--scale", type=float, default=4.0, help="--mix: divide the 7B lengths by")
    ap.add_argument("--max-tokens", type=int, default=0, help="--mix: budget (0 = the longest)")
    ap.add_argument(
        "--shares",
        default="",
        help="sampled shares, e.g. 0.03,0.5: the LM head's "
        "peak, chunked vs unchunked, at --lengths' first length",
    )
    ap.add_argument("--chunk", type=int, default=0, help="--shares: head chunk (0 = head.CHUNK)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--mix-child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child or args.mix_child:
        import torch

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
        if args.child:
            print(json.dumps(child(args.child[0], int(args.child[1]), args.mask_frac)))
        else:
            path, lengths, budget = args.mix_child
            lengths = [int(x) for x in lengths.split(",")]
            print(json.dumps(mix_child(path, lengths, args.mask_frac, int(budget))))
        return
    if args.mask_frac is None:  # the mix: the measured p95 share of the replayed ground truths
        args.mask_frac = 0.033 if args.mix else 0.1
    if args.mix:
        return run_mix(args)
    if args.shares:
        return run_shares(args)
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
