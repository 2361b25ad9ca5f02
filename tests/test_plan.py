"""`rcgrpo plan`: parameter and memory arithmetic by hand, the rollout simulation on
cases worked out by hand (lock-step waits for a round's slowest message, async does not), and
the command: the paper preset fits 8 x 80 GB with >= 8 % headroom in every phase, one 24 GB
GPU exits 2 with one line; the per-layer constants equal a fresh measurement.

    .venv/bin/pytest tests/test_plan.py -q
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest

from rcgrpo.training.plan import constants as C
from rcgrpo.training.plan import memory as M
from rcgrpo.training.plan import timing as T
from rcgrpo.training.plan.calibration import ASSUMED


def test_parameter_counts_match_the_published_models():
    assert C.architecture("qwen2.5-7b-instruct").params() == 7_615_616_512  # Qwen's 7.62B
    assert C.architecture("llama-3.1-8b-instruct").params() == 8_030_261_248  # Meta's 8.03B
    assert C.architecture("smollm2-135m").params() == 134_515_008
    qwen = C.architecture("qwen2.5-7b-instruct")
    # r x (in + out) per projection: q, o 16 x 7168; k, v 16 x 4096; gate, up, down 16 x 22528
    per_layer = 16 * (2 * 7168 + 2 * 4096 + 3 * 22528)
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert qwen.lora_params(16, targets) == 28 * per_layer == 40_370_176


def test_qwen_shape_architecture_is_the_built_model():
    """The CPU stand-in's arithmetic is that of the model load_policy builds."""
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig

    model = load_policy(ModelConfig(profile="qwen-shape", lora=False)).model
    assert sum(p.numel() for p in model.parameters()) == C.architecture("qwen-shape").params()


def test_memory_terms_by_hand():
    toy = C.Arch(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, head_dim=4, vocab=100,
                 tied=False, source="toy")  # fmt: skip
    layer = M.Layer(saved=200.0, peak=296.0)  # per token: 200 saved, 96 more in backward
    ckpt = M.update_terms(toy, tokens=10, sampled=3, b=2, checkpointing=True, layer=layer)
    # checkpointed inputs 2 x 10 x 8 x 2; then the larger of one layer's 10 x 296 and the
    # logits' 3 x 100 x 16 (freed before the layers' backward: never both)
    assert [t.bytes for t in ckpt] == [2 * 10 * 8 * 2, 3 * 100 * 16]
    ckpt = M.update_terms(toy, tokens=20, sampled=3, b=2, checkpointing=True, layer=layer)
    assert [t.bytes for t in ckpt] == [2 * 20 * 8 * 2, 20 * 296]
    full = M.update_terms(toy, tokens=10, sampled=0, b=4, checkpointing=False, layer=layer)
    assert [t.bytes for t in full] == [2 * 10 * 200 + 10 * 96]
    assert M.kv_bytes_per_token(toy, 2) == 2 * 2 * 4 * 2
    static = M.static_terms(toy, 2, lora_params=50, gpus=2, reference=True)
    assert [t.bytes for t in static] == [toy.params() * 2, (50 + 16) * 16, 50 * 4, 50 * 4]
    # the largest micro-batch that fits 10 kB at a sampled share of 0.1: per token the larger
    # of 296 and 0.1 x 100 x 16 = 160, + 2 x 8 x 2 checkpointed
    per = 32 + 296
    assert M.largest_tokens(toy, 2, True, 0.1, 10_000, layer) == int(10_000 / (per * 1.05))
    # vLLM: its context outside the share (vLLM snapshots free memory after creating it), then
    # non-torch memory, weights, overhead, LoRA slots, and the KV cache fills the share
    terms, tokens = M.vllm_terms(toy, 2, 0.5, 1e10, slots=1e6)
    assert terms[0].bytes == C.CUDA_CONTEXT_GB * C.GB and "outside its share" in terms[0].name
    fixed = C.VLLM_NON_TORCH_GB * C.GB + toy.params() * 2 + C.VLLM_OVERHEAD_GB * C.GB + 1e6
    assert terms[-1].bytes == pytest.approx(5e9 - fixed)
    assert M.total(terms) == pytest.approx(C.CUDA_CONTEXT_GB * C.GB + 5e9)
    assert tokens == pytest.approx((5e9 - fixed) / 32)


def test_plan_constants_equal_a_fresh_measurement_of_one_layer():
    """layers.json (`rcgrpo plan --measure`) within 10 % of measuring the layer again now:
    qwen-shape at its full width and the 7B profile's full-width bf16 layer (~30 s)."""
    from rcgrpo.training.plan.measure import per_token, recorded

    layers = recorded()["layers"]
    for profile in ("qwen-shape", "qwen2.5-7b-instruct"):
        fresh = per_token(profile)
        for key in ("saved", "peak"):
            assert fresh[key] == pytest.approx(layers[profile][key], rel=0.10), (profile, key)
    # bf16 compute keeps no float32 copy of the LoRA inputs: 211 against peft's 321 kB
    assert (
        layers["qwen2.5-7b-instruct"]["saved"]
        < 0.7 * layers["qwen2.5-7b-instruct"]["fp32_adapters_saved"]
    )


GPU = C.GPU("toy", 1, bf16_flops=1e30, bandwidth=1e12, source="toy")  # memory-bound only
ARCH = C.Arch(1, 8, 16, 2, 1, 4, 100, False, "toy")


def engine(max_seqs=8, kv=1e9, **assumed):
    k = dataclasses.replace(ASSUMED, **assumed)
    return T.Engine(arch=ARCH, b=1, gpu=GPU, kv_tokens=kv, max_seqs=max_seqs, k=k)


def test_engine_iteration_cost_by_hand():
    e = engine(iteration_s=0.0, bandwidth_eff=1.0)
    w = ARCH.params()  # bytes of weights read per iteration (b = 1)
    kv = 2 * 1 * 4 * 1  # per context token
    assert e.iteration_s([10, 20], []) == pytest.approx((w + kv * 30) / 1e12)
    # one request: 4 tokens of prefill in one iteration (context 0), then 2 decodes at 4 and 5
    q = [T._Req(0.0, 1, 0, 4, 2, 0)]
    done = e.serve(q, 0.0)
    assert e.iterations == 3
    assert done == pytest.approx((3 * w + kv * (0 + 4 + 5)) / 1e12)


def test_lock_step_waits_for_the_slowest_message_async_does_not(monkeypatch):
    """A samples 6 then 1 tokens, B 1 then 6. Lock-step: each round lasts 1 prefill + 6 decode
    iterations, 14 in all. Async: B's second message starts while A is still on its first
    (iterations 3-9), A's second is 2 iterations: 9."""
    monkeypatch.setattr(T, "TOOL_S", 0.0)
    eps = [[(1, 6), (1, 1)], [(1, 1), (1, 6)]]
    lock, free = engine(iteration_s=1.0), engine(iteration_s=1.0)  # weights etc. negligible
    assert lock.run(eps, lock_step=True, shared=[False, False]) == pytest.approx(14, rel=1e-6)
    assert free.run(eps, lock_step=False, shared=[False, False]) == pytest.approx(9, rel=1e-6)
    assert (lock.iterations, free.iterations) == (14, 9)
    # one slot (max_seqs 1): lock-step serves a round's messages one after another: 7 + 2, 2 + 7
    one = engine(max_seqs=1, iteration_s=1.0)
    assert one.run(eps, lock_step=True, shared=[False, False]) == pytest.approx(18, rel=1e-6)
    # a closing segment that samples nothing is no model call
    closing = engine(iteration_s=1.0).run([[(1, 2), (1, 0)]], True, [False])
    assert closing == pytest.approx(3, rel=1e-6)


def test_kv_capacity_limits_concurrency():
    eps = [[(10, 2)], [(10, 2)]]  # each needs 12 tokens of KV
    roomy, tight = engine(kv=100, iteration_s=1.0), engine(kv=15, iteration_s=1.0)
    assert roomy.run(eps, False, [False, False]) == pytest.approx(3, rel=1e-6)  # together
    assert tight.run(eps, False, [False, False]) == pytest.approx(6, rel=1e-6)  # one at a time


def test_update_flops_by_hand():
    """Padded rows compute and attend k x the longest; the counts of flops.py, by hand."""
    lengths, groups, sampled = [4, 2], [[0, 1]], [1, 1]
    n = ARCH.params() - ARCH.vocab * ARCH.hidden * 2  # the decoder's weights
    att = 4 * 1 * 8  # 4 L q per attended pair
    # one forward: 2 rows of 4 computed (8 tokens), 2 x 4^2 / 2 = 16 pairs, 2 head positions
    fwd = {"linear": 2 * n * 8, "attention": att * 16, "head": 2 * 100 * 8 * 2}
    one = sum(fwd.values())
    # LoRA (no adapter weights counted here), checkpointing: forward + recompute + backward
    # (linear 1x, attention 2.5x, head 1x); pi_old and the reference: a forward each
    backward = fwd["linear"] + 2.5 * fwd["attention"] + fwd["head"]
    args = (ARCH, lengths, groups, False, 1, True, True, True)
    assert T.update_flops(*args, sampled=sampled) == pytest.approx(2 * one + 2 * one + backward)
    # rl.behaviour_logprobs: engine: no pi_old forward
    assert T.update_flops(*args, False, sampled=sampled) == pytest.approx(one + 2 * one + backward)
    # packed rows, a full fine-tune, no checkpointing, 2 passes, no head counted: 6 tokens,
    # 16/2 + 4/2 = 10 pairs; backward linear 2x (weight gradients), attention 2.5x
    fwd = {"linear": 2 * n * 6, "attention": att * 10}
    full = fwd["linear"] * 3 + fwd["attention"] * 3.5
    packed = T.update_flops(ARCH, lengths, groups, True, 2, False, False, False)
    assert packed == pytest.approx(sum(fwd.values()) + 2 * full)


def test_flops_of_lora_adapters_and_a_shared_prefix():
    from rcgrpo.training.plan import flops as F

    # a prefix of 3 computed once, suffixes of 1 and 2: 9/2 + (3 + 1/2) + (6 + 2) pairs
    assert F.shared_pairs(3, [1, 2]) == 4.5 + 3.5 + 8
    assert F.causal_pairs([4, 2]) == 8 + 2
    work = F.Work(tokens=10, pairs=0)
    # LoRA of R weights: 2 R per token forward; backward 2x (input and adapter gradients)
    with_lora = F.step_flops(ARCH, work, lora=True, lora_params=5, checkpointing=False, scoring=0)
    without = F.step_flops(ARCH, work, lora=True, lora_params=0, checkpointing=False, scoring=0)
    assert with_lora - without == 2 * 5 * 10 * (1 + 2)


def test_episode_shapes_are_the_measured_lengths():
    shapes = T.episode_shapes()
    lengths = sorted(sum(p + s for p, s in e) for e in shapes.values())
    assert len(shapes) == 800 and lengths[-1] == 72_536  # README's token-budget table
    assert 6_400 <= lengths[400] <= 6_600  # median 6,5xx


def plan_cli(*args):
    cmd = [sys.executable, "-m", "rcgrpo.cli", "plan", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_paper_preset_fits_8_h100_and_one_24gb_gpu_exits_2_with_one_line():
    paper = ["--profile", "qwen2.5-7b-instruct", "--preset", "paper"]
    out = plan_cli(*paper, "--gpus", "8", "--gpu-memory", "80")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for term in (
        "weights (frozen)",
        "LoRA + AdamW",
        "reference: frozen copy",
        "checkpointed",
        "one layer recomputed",
        "vLLM KV cache",
        "vLLM LoRA slots",
        "NCCL buffers",
        "vLLM CUDA context",
        "85.0 GB physical",
        "measured by `rcgrpo plan --measure`",
        "rl rollouts: vLLM awake, trainer cache empty",
        "rl update, vLLM asleep",
        "fp32 master weights",
        "scheduler lockstep",
        "scheduler async",
        "tokens/s/GPU",
        "NeMo RL",
    ):
        assert term in text, term
    assert text.rstrip().endswith("fits: yes")
    headroom = [float(h) for h in re.findall(r"headroom ([\d.]+)%", text)]
    assert len(headroom) == 3 and min(headroom) >= 8.0, headroom
    small = plan_cli(*paper, "--gpus", "1", "--gpu-memory", "24")
    assert small.returncode == 2 and small.stdout == ""
    lines = small.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: rl:"), lines
    # vLLM resident through the update (no sleep): under 8 % headroom, exit 2 with one line
    awake = plan_cli(
        *paper,
        "--gpus",
        "8",
        "--gpu-memory",
        "80",
        "--set",
        "rollout.vllm_sleep_mode=false",
        "--set",
        "rollout.vllm_gpu_memory_utilization=0.28",
    )
    lines = awake.stderr.strip().splitlines()
    assert awake.returncode == 2 and len(lines) == 1 and "8% headroom" in lines[0], awake.stderr
    # the profile's own 81,920-token episodes with vLLM asleep: the update fits
    long = plan_cli(
        *paper, "--gpus", "8", "--gpu-memory", "80", "--set", "rl.max_tokens_per_micro_batch=200000"
    )
    assert long.returncode == 2 and "set rl.max_tokens_per_micro_batch <=" in long.stderr, (
        long.stderr
    )


@pytest.mark.slow
def test_plan_formula_predicts_the_measured_peak_of_the_mix():
    """bench/memory.py --mix at 1/16 of the 7B lengths (384-2,672 tokens, ~80 s): the token-budget
    update's measured peak is within 25 % of what rcgrpo.training.plan.memory predicts, and at
    most half of today's padded micro-batch's."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, str(root / "bench" / "memory.py"), "--mix", "--scale", "16",
           "--threads", "1"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    measured = float(re.search(r"measured / predicted: ([\d.]+)", out.stdout).group(1))
    ratio = float(re.search(r"token-budget/padded peak memory: ([\d.]+)", out.stdout).group(1))
    assert 0.75 <= measured <= 1.25, out.stdout
    assert ratio <= 0.5, out.stdout


def test_a_sampled_cap_is_counted_and_its_excess_named():
    """rl.max_sampled_per_micro_batch bounds the LM head's positions per forward: the plan counts
    the cap instead of the assumed share, and when the cap is what does not fit it says how far
    to lower it (the token budget is not the culprit then)."""
    base = [sys.executable, "-m", "rcgrpo.cli", "plan", "--profile", "qwen2.5-7b-instruct",
            "--preset", "paper", "--gpus", "8", "--gpu-memory", "80", "--set"]  # fmt: skip
    big = subprocess.run(base + ["rl.max_sampled_per_micro_batch=20000"], capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert big.returncode == 2
    said = big.stderr.strip().splitlines()[-1]
    assert said.startswith("error: rl: 20,000 sampled positions per micro-batch need ")
    lower = int(said.rsplit("<= ", 1)[1].replace(",", ""))
    assert 8000 < lower < 20000
    ok = subprocess.run(base + [f"rl.max_sampled_per_micro_batch={lower}"], capture_output=True,
                        text=True, timeout=300)  # fmt: skip
    assert ok.returncode == 0 and "fits: yes" in ok.stdout


def _paper_plan(*sets: str, gpus: int = 8):
    from rcgrpo.cli.plan import resolve
    from rcgrpo.training.plan.report import make_plan

    cfg = resolve("paper", list(sets), "qwen2.5-7b-instruct")
    parts = (cfg["model"], cfg["rollout"], cfg["rl"], cfg["finetune"], cfg["stage"])
    return make_plan(*parts, gpus, C.GPUS["h100"], 80)


def test_rollout_phase_counts_every_process_the_rl_stage_starts_on_a_gpu():
    """On each GPU the rl stage starts one trainer rank and its vLLM server. The server's CUDA
    context exists before vLLM measures the free memory its share is taken from, so the GPU
    holds the trainer + that context + util x the physical size: the share that fit only
    without the context is refused, with a lower one named."""
    plan = _paper_plan()
    roll = next(p for p in plan.phases if p.title.startswith("rl rollouts"))
    contexts = [t for t in roll.terms if "CUDA context" in t.name]
    assert [t.name for t in contexts] == ["CUDA context", "vLLM CUDA context (outside its share)"]
    trainer = sum(t.bytes for t in roll.terms if not t.name.startswith("vLLM"))
    util = 0.7
    assert roll.bytes == pytest.approx(trainer + C.CUDA_CONTEXT_GB * C.GB + util * plan.gpu_bytes)
    # a share that fits with 0.25 GB to spare when the server's context is left out: refused
    usable = plan.gpu_bytes * (1 - C.HEADROOM)
    close = round((usable - trainer - 0.25e9) / plan.gpu_bytes, 4)
    refused = _paper_plan(f"rollout.vllm_gpu_memory_utilization={close}")
    said = refused.problems[0]
    assert said.startswith("rl: set rollout.vllm_gpu_memory_utilization <= "), said
    assert float(said.split("<= ")[1].split()[0]) < close
    # the transformers engine: the rollouts run in the trainer, its context counted there too
    hf = _paper_plan("rollout.engine=hf", gpus=64)
    roll = next(p for p in hf.phases if p.title.startswith("rl rollouts"))
    assert {"CUDA context", "NCCL buffers", "allocator slack"} <= {t.name for t in roll.terms}
