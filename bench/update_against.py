"""`bench/update.py --against REF`: the RL update of this checkout against the same update at an
earlier commit REF, in one run, so a slowdown between commits shows as a ratio measured under
the same load.

How: the rollouts are written once (the CPU default's 8 RL tasks x G = 5 with RC-GRPO goals,
each the task's ground truth replayed through the agent loop with the qwen-shape tokenizer and
compact docs, at bench/peer_trl.py's budgets: 96 tokens a message, 6 messages, 1,536 an
episode; sampled tokens redrawn at random per rollout). REF is checked out into a temporary
`git worktree` (under cache/, with the rollouts file; its cache/ is this checkout's, so the
qwen-shape model is built once), removed and pruned at the end, on an error and on SIGINT,
SIGTERM or SIGHUP; one left by a SIGKILL is removed by the next run (tests/test_update_
against.py). Then bench/update_commit.py runs in a fresh process per side, with that side's
src/ on PYTHONPATH, HEAD and REF interleaved (ABBA...) so that the other load of a shared
machine falls on both: `--repeats` pairs. Each process times `--steps` updates, in
wall seconds and in its own CPU seconds (one torch thread: the CPU time is the work, barely
moved by the other jobs, where the wall time waits for them); a side's figure is its mean, a
ratio the median over the pairs of HEAD's / REF's. Last lines: `update time HEAD/REF: X`
(wall) and `update CPU time HEAD/REF: Y`.

    .venv/bin/python bench/update.py --against 007baed            # ~5 min on 2 shared cores
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).resolve().parent / "update_commit.py"
GROUP = 5
MAX_NEW_TOKENS, MAX_STEPS, EPISODE_TOKENS = 96, 6, 1536  # bench/peer_trl.py's budgets


def write_rollouts(path: Path, seed: int = 0) -> dict:
    """The rollouts file bench/update_commit.py reads; returns a summary (count, lengths)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from peer_trl import preset_data

    from rcgrpo.chat.prompts import Renderer
    from rcgrpo.chat.record import HIGH, LOW
    from rcgrpo.config import read_params
    from rcgrpo.data.ceiling import replay
    from rcgrpo.models.loading import load_policy
    from rcgrpo.models.profiles import ModelConfig
    from rcgrpo.rollout.agent_loop import Limits
    from rcgrpo.training.grpo.core_algos import sample_reward_tokens

    tasks, _ = preset_data(read_params())
    policy = load_policy(ModelConfig(profile="qwen-shape", lora=False, compact_docs=True))
    renderer = Renderer(policy.tokenizer, policy.stop_id)
    limits = Limits(MAX_NEW_TOKENS, EPISODE_TOKENS, MAX_STEPS)
    g = torch.Generator().manual_seed(seed)
    high = sample_reward_tokens(len(tasks), GROUP, 0.5, "iid", g)  # (n, G)
    vocab = policy.model.config.vocab_size
    rows = []
    for task, goals in zip(tasks, high.tolist(), strict=True):
        for k, h in enumerate(goals):
            goal = HIGH if h else LOW
            rollout, _ = replay(task, renderer, "combined", limits, True, goal)
            ids = torch.tensor(rollout.ids)
            sampled = torch.tensor(rollout.loss_mask, dtype=torch.bool)
            ids[sampled] = torch.randint(0, vocab, (int(sampled.sum()),), generator=g)
            rows.append(
                {
                    "ids": ids.tolist(),
                    "mask": sampled.int().tolist(),
                    "logprobs": [-1.0 if s else 0.0 for s in sampled.tolist()],
                    "stop": rollout.stop_reason,
                    "prompt_len": rollout.prompt_len,
                    "goal": goal,
                    "reward": int(k % GROUP in (0, 2)),  # a spread in every group
                }
            )
    path.write_text(json.dumps({"group": GROUP, "rollouts": rows}))
    lengths = [len(r["ids"]) for r in rows]
    return {"rollouts": len(rows), "min": min(lengths), "max": max(lengths), "sum": sum(lengths)}


class _Stop(BaseException):
    """A SIGTERM or SIGHUP, raised where the bench is, so the worktree's `finally` runs."""


def _raise_stop(signum, _frame) -> None:
    raise _Stop(signal.Signals(signum).name)


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True)
    return done.stdout.strip()


def remove_stale(root: Path) -> list[str]:
    """Removes the worktrees under `root`/cache/ that an `against` killed by SIGKILL left
    registered (their owner's pid, in the folder's name, is gone), then prunes; their paths."""
    removed = []
    for line in _git(root, "worktree", "list", "--porcelain").splitlines():
        path = Path(line.removeprefix("worktree ")) if line.startswith("worktree ") else None
        found = path and re.fullmatch(r"against-[0-9a-f]+-(\d+)-\w+", path.parent.name)
        if not found or path.parent.parent != root / "cache" or _alive(int(found[1])):
            continue
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=root)
        shutil.rmtree(path.parent, ignore_errors=True)
        removed.append(str(path))
    subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def worktree(ref: str, root: Path = ROOT):
    """A detached `git worktree` of `ref` under `root`/cache/ (its cache/ linked to `root`'s);
    yields (its root, the commit it resolved to). Removed and pruned on exit, on an error and on
    SIGINT, SIGTERM or SIGHUP (raised here as exceptions, a second one ignored while it cleans
    up); after a SIGKILL, the next run removes it (`remove_stale`)."""
    commit = _git(root, "rev-parse", "--short", f"{ref}^{{commit}}")
    (root / "cache").mkdir(exist_ok=True)
    remove_stale(root)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGHUP, _raise_stop)
    parent = Path(tempfile.mkdtemp(prefix=f"against-{commit}-{os.getpid()}-", dir=root / "cache"))
    tree = parent / "tree"
    try:
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(tree), commit], cwd=root, check=True
        )
        (tree / "cache").symlink_to(root / "cache")
        yield tree, commit
    finally:
        for s in before:
            signal.signal(s, signal.SIG_IGN)  # a second signal must not cut the clean-up short
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(tree)], cwd=root, capture_output=True
        )
        shutil.rmtree(parent, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True)
        for s, handler in before.items():
            signal.signal(s, handler)


def run_side(tree: Path, rollouts: Path, steps: int, threads: int, extra: list[str]) -> dict:
    """bench/update_commit.py in a fresh process with `tree`/src first on sys.path (under the
    guard of rcgrpo.procs: it dies with this process); its JSON line."""
    from rcgrpo.procs import guarded

    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": str(threads)}
    cmd = [
        sys.executable,
        str(CHILD),
        "--rollouts",
        str(rollouts),
        "--steps",
        str(steps),
        "--threads",
        str(threads),
        *(["--set", *extra] if extra else []),
    ]
    proc = subprocess.Popen(
        guarded(cmd, module=False),
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate()
    finally:
        if proc.poll() is None:  # stopped: SIGTERM lets the guard stop the update's group
            proc.terminate()
            proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"{tree}: bench/update_commit.py failed:\n{stderr[-3000:]}")
    out = json.loads(stdout.strip().splitlines()[-1])
    if Path(out["rcgrpo"]).resolve() != (tree / "src" / "rcgrpo").resolve():
        raise RuntimeError(f"{tree}: imported rcgrpo from {out['rcgrpo']}, not its own src/")
    return out


def against(ref: str, repeats: int, steps: int, threads: int, extra: list[str]) -> float:
    """Prints each run and `update time HEAD/REF: X`; returns X."""
    with worktree(ref) as (tree, commit):
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        rollouts = tree.parent / "rollouts.json"  # removed with the worktree
        info = write_rollouts(rollouts)
        print(
            f"{info['rollouts']} rollouts (8 tasks x G = {GROUP}), tokens {info['min']}-"
            f"{info['max']}, sum {info['sum']}; qwen-shape full fine-tune, {threads} thread(s); "
            f"HEAD = {head}{' + uncommitted src/' if dirty else ''}, REF = {commit}"
        )
        sides = {"HEAD": ROOT, "REF": tree}
        wall: dict[str, list[float]] = {"HEAD": [], "REF": []}
        cpu: dict[str, list[float]] = {"HEAD": [], "REF": []}
        for i in range(repeats):
            for name in ("HEAD", "REF") if i % 2 == 0 else ("REF", "HEAD"):
                out = run_side(sides[name], rollouts, steps, threads, extra)
                secs = [s["update_s"] for s in out["steps"]]
                wall[name].append(statistics.mean(secs))
                cpu[name].append(statistics.mean(s["update_cpu_s"] for s in out["steps"]))
                print(
                    f"  {name:4s} run {i + 1}: update "
                    + " ".join(f"{s:6.2f}" for s in secs)
                    + f" s/step (CPU {cpu[name][-1]:.2f} s), loss {out['steps'][0]['loss']:+.6f}"
                    f", shared prefix {out['shared_prefix']}, load {os.getloadavg()[0]:.2f}"
                )
    for name in wall:
        print(
            f"{name} ({head if name == 'HEAD' else commit}): {statistics.median(wall[name]):.2f} s"
            f"/update, CPU {statistics.median(cpu[name]):.2f} s (medians of {repeats})"
        )
    ratio, ratio_cpu = (
        statistics.median(h / r for h, r in zip(t["HEAD"], t["REF"], strict=True))
        for t in (wall, cpu)
    )
    print(f"update CPU time HEAD/REF: {ratio_cpu:.3f}")
    print(f"update time HEAD/REF: {ratio:.3f} (HEAD {head}, REF {commit})")
    return ratio
