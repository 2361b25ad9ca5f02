"""Benchmark: the same RC-GRPO run on rcgrpo and on TRL 1.16's GRPOTrainer, side by side.

What it measures, in one process, on the CPU (TRL: `pip install -e ".[peer]"`):
  1. one start: the CPU default's 16 RCTP-FT rows (its 8 short RL tasks, experts + 1:1
     failures, built by the real dataset code) with every call written as `<tool_call>` JSON (the
     only form TRL parses; rcgrpo parses it too), fine-tuned with the preset's RCTP-FT recipe on
     the `qwen-shape` profile (Qwen2.5's tokenizer and tool template: TRL's tool parsing needs a
     real template; full fine-tune, compact tool docs: 416-872-token prompts). Cached under
     --out by recipe hash (~15 min on 2 shared cores the first time);
  2. RL from that start on both sides: the same 8 tasks, all per step, G = 5, a reward token per
     rollout with P(high) = 0.5 (TRL: drawn in the environment's reset(); the same tokens per
     step, task and rollout slot on both sides), --steps steps of 4 optimizer steps each
     (mini-batch 10 rollouts), lr 2e-4 (AdamW, constant), grad clip 1, beta 0.1 (k3 to the frozen
     start), clip 0.2, temperature 1, at most 96 tokens per message and 6 messages per episode,
     token-mean loss per mini-batch (TRL `loss_type="bnpo"`, one micro-batch per optimizer step),
     `scale_rewards="group"`, `use_bias_correction_kl=False`. TRL runs through
     `environment_factory` over rcgrpo's BFCL environment (bench/peer_trl_env.py: the sandboxed
     executor, the paper reward); its first prompts are checked token-identical to rcgrpo's;
  3. greedy success on the RL tasks under <|high_reward|> before RL and after RL on each side,
     scored by the same evaluator (rcgrpo.evaluation, combined protocol), Wilson 95 %.
Printed per side: seconds per RL step (rollout = generation + tools + scoring, update = pi_old and
reference log-probs + PPO), sampled tokens/s during the rollout, the reward per step, the
zero-variance fraction, greedy success after RL; then where the time goes (generation calls,
context tokens prefilled, LM-head rows in the update, seconds per phase); threads and load; last
line: rcgrpo step time / TRL step time (below 1 = rcgrpo faster).

Settings with no TRL equivalent, or that differ (tests/test_peer_trl.py pins the equalities):
  - advantages: TRL "group" = (R - mean) / (sample std + 1e-4); rcgrpo "grpo" = (R - mean) /
    (population std + 1e-6), exact 0 for a zero-variance group: TRL's are sqrt((G-1)/G) = 0.894x
    rcgrpo's at G = 5 (TRL "none" = rcgrpo "mean" exactly). rcgrpo's sign advantage 2R - 1 and
    TRL's "batch" scaling have no counterpart.
  - KL: rcgrpo clamps log r to [-20, 20] and k3 to <= 10 (verl's low_var_kl), TRL does neither;
    TRL's default use_bias_correction_kl=True multiplies k3 by the ratio (off here); rcgrpo's
    k1/k2 estimators have no TRL setting. rcgrpo clamps the policy log-ratio to [-20, 20].
  - aggregation: rcgrpo seq-mean skips all-masked rollouts, TRL "grpo" counts them as 0;
    "bnpo" equals rcgrpo token-mean only with one micro-batch per optimizer step.
  - reward tokens: stratified sampling (each token once per group) needs the whole group; TRL's
    reset() sees one rollout (GoalDraw supplies rcgrpo's draw here).
  - episodes: TRL parses only JSON <tool_call> calls (not BFCL's python form), cannot end an
    episode from a tool (after done() the model is asked again: that message is sampled and
    trained), does not execute the calls of its last allowed message, and has one user turn (no
    BFCL turn-by-turn protocol, no miss_func reveal): the comparison runs the combined protocol.
    Its budget counts completion tokens (here 1536 - the longest prompt), rcgrpo's the episode.
    An unknown tool name gets TRL's {'error': ...} instead of rcgrpo's observation; rcgrpo
    escapes special-token text in tool output, TRL does not.
  - prompt: TRL renders tool schemas from docstrings; here it is handed rcgrpo's tool entries
    (trainer._env_tools, what it renders and types arguments with), so both prompts are
    identical. Samples differ: rcgrpo seeds per (episode, step), TRL uses the global RNG.
  - cost, not semantics: TRL computes the LM head (and entropy) at every completion position,
    tool tokens and padding included; rcgrpo at sampled positions only. TRL re-reads the whole
    context for each message; rcgrpo's engine keeps an episode's K/V between messages.

    pip install -e ".[peer]"                      # trl 1.16 + datasets into the venv
    .venv/bin/python bench/peer_trl.py            # 5 RL steps each side, ~30-60 min on 2 cores
    .venv/bin/python bench/peer_trl.py --steps 20 # params.yaml's 20 steps
    .venv/bin/python bench/peer_trl.py --threads 2
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its two modules, also when imported

import peer_trl_env as penv  # noqa: E402
import peer_trl_runs as runs  # noqa: E402

MAX_NEW_TOKENS = 96  # per message: the longest expert call in JSON form is 72 qwen tokens
EPISODE_TOKENS = 1536  # params.yaml's episode budget (prompt included)


# -- the start ---------------------------------------------------------------------------------
def section(params: dict, name: str, cls, extra: dict | None = None):
    """A stage config: params.yaml section (the CPU default) + `extra`."""
    from rcgrpo.config import build

    values = dict(params.get(name) or {})
    return build(cls, {**values, **(extra or {})}, f"params.yaml:{name}")


def json_call(text: str) -> str:
    """A BFCL call string as Qwen2.5 writes a tool call (what the qwen-shape template renders)."""
    from rcgrpo.bfcl.executor import parse_calls

    parsed = parse_calls(text)
    if parsed.errors or len(parsed.calls) != 1 or parsed.calls[0].args:
        raise ValueError(f"{text!r}: expected one call with keyword arguments")
    call = parsed.calls[0]
    args = json.dumps(call.kwargs, ensure_ascii=False)
    return f'<tool_call>\n{{"name": "{call.name}", "arguments": {args}}}\n</tool_call>'


def json_form(record):
    """The record with each assistant message's calls written as <tool_call> JSON blocks."""
    messages = [
        {**m, "content": "\n".join(json_call(c) for c in m["tool_calls"])}
        if m["role"] == "assistant" and m.get("tool_calls")
        else m
        for m in record.messages
    ]
    return dataclasses.replace(record, messages=messages)


def preset_data(params: dict):
    """The CPU default's RL tasks and its mixed RCTP-FT rows, calls in JSON form."""
    from rcgrpo.chat.record import read_jsonl
    from rcgrpo.data.dataset import DatasetConfig, build_folder, tasks_of
    from rcgrpo.envs.bfcl.environment import BFCL

    extra = {"test_tasks": 4, "rollouts": "off", "commit": False, "push": False}
    with tempfile.TemporaryDirectory() as tmp:
        build_folder(section(params, "dataset", DatasetConfig, extra), Path(tmp), BFCL)
        rows = Path(tmp) / "rctp" / "train.jsonl"
        return tasks_of(rows, "train", BFCL), [json_form(r) for r in read_jsonl(rows)]


def start_model(params: dict, records, model_cfg, out: Path, seed: int) -> tuple[Path, str]:
    """RCTP-FT of `records` (the preset's recipe) saved once per recipe; (folder, how)."""
    from rcgrpo.envs.bfcl.environment import BFCL
    from rcgrpo.models.loading import load_policy, save_policy
    from rcgrpo.training.sft import render_examples, train_sft
    from rcgrpo.training.sft_config import SFTConfig

    cfg = section(params, "rctp", SFTConfig, {"seed": seed, "out_dir": str(out / "rctp")})
    recipe = json.dumps([[r.to_json() for r in records], repr(cfg), repr(model_cfg)])
    folder = out / f"start-{hashlib.sha1(recipe.encode()).hexdigest()[:10]}"
    if folder.exists():
        return folder, "cached"
    t0 = time.perf_counter()
    policy = load_policy(model_cfg)
    examples = render_examples(policy, records, cfg, BFCL)
    history = train_sft(policy.model, examples, cfg, pad_id=policy.tokenizer.pad_token_id or 0)
    save_policy(policy, folder, {"stage": "rctp", "protocol": penv.PROTOCOL})
    how = f"RCTP-FT {cfg.epochs} epochs, loss {history[-1]['sft/loss']:.4f}"
    return folder, f"{how}, {time.perf_counter() - t0:.0f} s"


def greedy(policy, tasks, rollout_cfg, out: Path) -> tuple[int, int]:
    """Greedy paper-reward successes (k, n) on `tasks` under <|high_reward|>, combined protocol."""
    from rcgrpo.envs.bfcl.environment import BFCL
    from rcgrpo.evaluation.config import EvalConfig
    from rcgrpo.evaluation.evaluate import evaluate
    from rcgrpo.rollout.execution import make_engine

    engine = make_engine(dataclasses.replace(rollout_cfg, temperature=0.0), policy, BFCL)
    cfg = EvalConfig(split="train", protocol=penv.PROTOCOL, other_protocol=False,
                     temperature=0.0, tokens=("high",), out_dir=str(out))  # fmt: skip
    pooled = evaluate(engine, cfg, tasks=tasks, environment=BFCL)["runs"]["high"][0]["paper"][
        "pooled"
    ]
    return int(pooled["k"]), int(pooled["n"])


# -- the report --------------------------------------------------------------------------------
def success(k: int, n: int) -> str:
    from rcgrpo.evaluation.stats import wilson

    lo, hi = wilson(k, n)
    return f"{k}/{n} = {100 * k / n:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def mean(rows: list[dict], key: str) -> float:
    return sum(r.get(key, 0.0) for r in rows) / max(1, len(rows))


def report(sides: dict, threads: int, loads: list[float]) -> None:
    print(f"\n{'side':7s} {'s/RL step (rollout + update)':29s} {'sampled tok/s':>13s}  "
          f"{'zero-var':>8s}  greedy after RL (high goal)   reward per step")  # fmt: skip
    for name, side in sides.items():
        rows = side["rows"]
        step, roll = mean(rows, "step_s"), mean(rows, "rollout_s")
        rate = sum(r["sampled"] for r in rows) / max(1e-9, sum(r["rollout_s"] for r in rows))
        curve = " ".join(f"{r['reward']:.2f}" for r in rows)
        print(f"{name:7s} {step:7.1f} ({roll:6.1f} + {step - roll:6.1f}){'':9s} {rate:13.0f}  "
              f"{mean(rows, 'zero_var'):8.3f}  {success(*side['after']):28s}  {curve}")  # fmt: skip
    print("\nwhere the time goes, mean per RL step:" + "".join(f"{n:>14s}" for n in sides))
    phases = {
        "rollout: generation (s)": lambda r: r.get("generation_s", 0),
        "rollout: tools, parsing, scoring (s)": lambda r: r["rollout_s"] - r.get("generation_s", 0),
        "update: pi_old + reference log-probs (s)": lambda r: r.get("logprobs_s", 0),
        "update: PPO forward, backward, AdamW (s)": lambda r: r["step_s"] - r["rollout_s"]
        - r.get("logprobs_s", 0),
        "  of which AdamW steps (s)": lambda r: r.get("optimizer_s", 0),
        "LM-head forwards in the update (s)": lambda r: r.get("head_forward_s", 0),
        "generate calls": lambda r: r.get("generate_calls", 0),
        "context tokens prefilled": lambda r: r.get("prefilled", 0),
        "  with padding (TRL's generate)": lambda r: r.get("prefilled_padded", r.get("prefilled", 0)),
        "sampled tokens": lambda r: r["sampled"],
        "LM-head rows in the update": lambda r: r.get("head_rows", 0),
        "episodes cut by the token budget": lambda r: r.get("truncated", 0),
    }  # fmt: skip
    for label, get in phases.items():
        values = [sum(get(r) for r in s["rows"]) / max(1, len(s["rows"])) for s in sides.values()]
        print(f"  {label:40s}" + "".join(f"{v:14.1f}" for v in values))
    ours, theirs = (mean(s["rows"], "step_s") for s in sides.values())
    print(f"load average: {' -> '.join(f'{x:.2f}' for x in loads)} (start, after rcgrpo, after "
          f"TRL; {os.cpu_count()} cores); torch threads {threads}")  # fmt: skip
    print(f"rcgrpo/TRL step time: {ours / theirs:.2f}x (below 1 = rcgrpo faster; "
          f"threads {threads}, load {loads[0]:.2f} -> {loads[-1]:.2f})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # the run
    parser.add_argument("--steps", type=int, default=5, help="RL steps per side (preset: 20)")
    parser.add_argument("--tasks", type=int, default=0, help="first N RL tasks (0 = all 8)")
    parser.add_argument("--group", type=int, default=0, help="G (0 = the preset's 5)")
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS, help="per message")
    parser.add_argument("--full-docs", action="store_true", help="BFCL JSON docs (4-7k prompts)")
    parser.add_argument("--seed", type=int, default=0, help="start, draws, sampling")
    parser.add_argument("--trl-cpu-head", action="store_true",
                        help="TRL's CPU LM head: every position, not the completion only")  # fmt: skip
    # the machine
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    parser.add_argument("--out", default="outputs/bench/peer_trl", help="results, cached start")
    args = parser.parse_args()

    from rcgrpo.runtime import apply_defaults, torch_thread_count

    apply_defaults()
    try:
        import trl
    except ImportError:
        sys.exit('error: TRL is not installed: pip install -e ".[peer]" (trl 1.16, datasets)')
    import torch

    from rcgrpo.chat.prompts import Renderer
    from rcgrpo.chat.record import HIGH
    from rcgrpo.config import read_params
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.training.grpo.config import RLConfig

    threads = torch_thread_count(args.threads)
    torch.set_num_threads(threads)  # both sides, training and generation
    loads, t0, out = [os.getloadavg()[0]], time.perf_counter(), Path(args.out)
    params = read_params()
    tasks, records = preset_data(params)
    tasks = tasks[: args.tasks] if args.tasks else tasks
    model_cfg = ModelConfig(profile="qwen-shape", lora=False, compact_docs=not args.full_docs,
                            seed=args.seed)  # fmt: skip
    start, how = start_model(params, records, model_cfg, out, args.seed)
    # micro-batches by count (10 rollouts = one per mini-batch), as TRL's per-device batch: then
    # TRL's "bnpo" is rcgrpo's token-mean per mini-batch (a token budget would regroup them)
    extra = {"seed": args.seed, "save_every": 0, "steps": args.steps, "out_dir": str(out / "rl"),
             "tasks_per_step": len(tasks), "max_tokens_per_micro_batch": 0,
             **({"group_size": args.group} if args.group else {})}  # fmt: skip
    rl_cfg = section(params, "rl", RLConfig, extra)
    budget = {} if args.full_docs else {"max_total_tokens": EPISODE_TOKENS}
    rollout_cfg = section(params, "rollout", RolloutConfig,
                          {"protocol": penv.PROTOCOL, "max_new_tokens": args.max_new_tokens,
                           "threads": threads, **budget})  # fmt: skip
    policy = load_policy(model_cfg, adapter_path=start)
    rollout_cfg = rollout_cfg.for_policy(policy)
    renderer = Renderer(policy.tokenizer, policy.stop_id)
    longest = max(len(renderer.prompt(*penv.first_prompt(t, policy.compact_docs, HIGH)))
                  for t in tasks)  # fmt: skip
    max_completion = rollout_cfg.max_total_tokens - longest  # TRL's budget excludes the prompt
    n_params = sum(p.numel() for p in policy.model.parameters()) / 1e6
    print(f"rcgrpo vs TRL {trl.__version__} GRPOTrainer (environment_factory): {len(tasks)} tasks "
          f"x G = {rl_cfg.group_size}, {args.steps} RL steps; torch threads {threads}, load "
          f"{loads[0]:.2f} ({os.cpu_count()} cores)")  # fmt: skip
    print(f"start: qwen-shape {n_params:.2f}M params, full fine-tune, "
          f"{'full JSON' if args.full_docs else 'compact'} tool docs ({how}); budgets: "
          f"{rollout_cfg.max_new_tokens} tokens/message, {rollout_cfg.max_steps} messages, episode "
          f"{rollout_cfg.max_total_tokens} (TRL: completion {max_completion} = the episode minus "
          f"the longest prompt, {longest}); TRL's LM head scores "
          f"{'every position (its CPU path)' if args.trl_cpu_head else 'completion positions (its GPU path)'}")  # fmt: skip
    before = greedy(policy, tasks, rollout_cfg, out / "eval" / "before")
    print(f"greedy before RL (both sides' start): {success(*before)}")
    del policy
    sides = {"rcgrpo": runs.run_rcgrpo(start, tasks, rl_cfg, rollout_cfg, model_cfg)}
    loads.append(os.getloadavg()[0])
    sides["TRL"] = runs.run_trl(start, tasks, rl_cfg, rollout_cfg, model_cfg, out / "trl",
                                max_completion, not args.trl_cpu_head)  # fmt: skip
    loads.append(os.getloadavg()[0])
    ours, theirs = (s["rows"] for s in sides.values())
    same = sum(a["goals"] == b["goals"] for a, b in zip(ours, theirs, strict=True))
    print(f"prompts: TRL's {sides['TRL']['checked_prompts']} first prompts token-identical to "
          f"rcgrpo's; reward goals per task identical on both sides in {same}/{args.steps} steps")  # fmt: skip
    for name, side in sides.items():
        side["after"] = greedy(side.pop("policy"), tasks, rollout_cfg, out / "eval" / name)
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(
        {"args": vars(args), "before": before, "loads": loads, "threads": threads, "sides": sides},
        default=str) + "\n")  # fmt: skip
    report(sides, threads, loads)
    print(f"total {time.perf_counter() - t0:.0f} s; result {out / 'result.json'}")


if __name__ == "__main__":
    main()
