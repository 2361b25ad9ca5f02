"""Tool calls under time and memory limits: the worker is killed and
replaced, the model gets "timed out" / "out of memory", the episode goes on with its state.

What a call cost is measured as the tool workers' CPU time (`with_cpu`), not the wall time a
caller waited: the limits count the worker's own time, so on a busy box a killed call takes
several times its limit in wall time, and a worker's restart more still.

    .venv/bin/pytest tests/test_sandbox.py -q
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_cli_pipeline import cpu_seconds

from rcgrpo.bfcl.checkers import ground_truth_calls, score, score_many
from rcgrpo.bfcl.conformance import cases
from rcgrpo.bfcl.environment import STEP_ENDED, Episode, LocalEpisode
from rcgrpo.bfcl.limits import configured
from rcgrpo.bfcl.sandbox import Sandbox, SandboxError
from rcgrpo.bfcl.tasks import get_task
from rcgrpo.envs.config import EnvConfig
from rcgrpo.owned import alive

LIMIT = 1.0
SLACK = 3.0  # CPU seconds of a worker's kill, restart and replay
X = "x" * 30_000  # the longest literal the parser lets through is ~32k characters
POWER = "power(base=10, exponent=300000000)"  # the reproductions of a CPU-bound tool call
LOG = "logarithm(value=2, base=3, precision=50000000)"

# (task, calls that set state up, hostile call, a normal call that must work afterwards)
MATH, FS, MSG = "multi_turn_base_15", "multi_turn_base_0", "multi_turn_base_14"
TW = FS  # multi_turn_base_0: GorillaFileSystem + TwitterAPI
TICKET, TRADE, TRAVEL, CAR = (
    "multi_turn_base_2",
    "multi_turn_base_100",
    "multi_turn_base_150",
    "multi_turn_base_50",
)
TW_LOGIN = "authenticate_twitter(username='analyst_pro', password='Kj8#mP9$vL2')"
CORPUS = [
    (MATH, ["add(a=1, b=2)"], POWER, "add(a=2, b=2)"),
    (MATH, ["add(a=1, b=2)"], LOG, "add(a=2, b=2)"),
    (MATH, [], "power(base=7, exponent=12345678901)", "add(a=2, b=2)"),
    (MATH, [], "square_root(number=2, precision=100000000)", "add(a=2, b=2)"),
    (MATH, [], "round_number(number=1.5, decimal_places=1000000000000000000)", "add(a=2, b=2)"),
    (MATH, [], "standard_deviation(numbers=[1e308, -1e308, 1e308])", "add(a=2, b=2)"),
    (MATH, [], f"mean(numbers={[1e308] * 3000})", "add(a=2, b=2)"),
    (FS, ["mkdir(dir_name='kept')"], "cp(source='document', destination='document')", "pwd()"),
    (FS, ["mkdir(dir_name='kept')"], f"echo(content='{X}', file_name='big.txt')", "ls()"),
    (FS, [], "cd(folder='" + "../" * 9000 + "')", "pwd()"),
    (FS, [], "tail(file_name='final_report.pdf', lines=1000000000000000000)", "pwd()"),
    (FS, [], f"grep(file_name='final_report.pdf', pattern='{X}')", "pwd()"),
    (FS, [], f"find(path='.', name='{X}')", "pwd()"),
    (MSG, [], f"send_message(receiver_id='USR002', message='{X}')", "list_users()"),
    (MSG, [], f"add_contact(user_name='{X}')", "list_users()"),
    (TW, [TW_LOGIN], f"post_tweet(content='{X}', tags={['#t'] * 1500})", "posting_get_login_status()"),
    (TW, [TW_LOGIN], f"mention(tweet_id=0, mentioned_usernames={['@a'] * 3000})", "posting_get_login_status()"),
    (TICKET, [], f"create_ticket(title='{X}', description='d', priority={10**300})", "ticket_get_login_status()"),
    (TICKET, [], f"edit_ticket(ticket_id=-1, updates={{'priority': {10**300}}})", "ticket_get_login_status()"),
    (TRADE, [], f"place_order(order_type='Buy', symbol='AAPL', price=1e308, amount={'9' * 3000})", "get_current_time()"),
    (TRADE, [], "fund_account(amount=1e308)", "get_current_time()"),
    (TRADE, [], f"notify_price_change(stocks={['AAPL'] * 3000}, threshold=-1e308)", "get_current_time()"),
    (TRAVEL, [], "compute_exchange_rate(base_currency='USD', target_currency='EUR', value=1e308)", "list_all_airports()"),
    (TRAVEL, [], f"get_nearest_airport_by_city(location='{X}')", "list_all_airports()"),
    (CAR, [], "fillFuelTank(fuelAmount=1e308)", "get_current_speed()"),
    (CAR, [], f"display_log(messages={['x'] * 3000})", "get_current_speed()"),
    (CAR, [], "setCruiseControl(speed=1e308, activate=True, distanceToNextVehicle=-1e308)", "get_current_speed()"),
]  # fmt: skip
CLASSES = {"GorillaFileSystem", "MathAPI", "MessageAPI", "TwitterAPI", "TicketAPI", "TradingBot",
           "TravelAPI", "VehicleControlAPI"}  # fmt: skip
KILLED = ("Error during execution: timed out after", "Error during execution: out of memory")


def proc_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) of a live process, from /proc (0 for none)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def with_cpu(box: Sandbox, fn, /, *args, **kwargs):
    """fn(*args, **kwargs) and the CPU seconds the sandbox's tool workers spent on it: a killed
    worker's from its exit (this process waits for it), the live one's from /proc."""
    pid = box.pid()
    before, children = proc_cpu(pid), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = fn(*args, **kwargs)
    return out, cpu_seconds(children) + proc_cpu(box.pid()) - before


@pytest.fixture(scope="module")
def sandbox():
    box = Sandbox(EnvConfig(tool_timeout_s=LIMIT, tool_memory_mb=1536))
    yield box
    box.close()


def test_corpus_covers_every_api_class():
    covered = set()
    for task_id, _, hostile, _ in CORPUS:
        name = hostile.split("(")[0]
        covered |= {c for c in get_task(task_id).involved_classes if name in _methods(c)}
    assert len(CORPUS) >= 20 and covered == CLASSES


def _methods(class_name: str) -> set[str]:
    import importlib

    from rcgrpo.bfcl.instances import backend, public_method_names

    cls = getattr(importlib.import_module(backend()[0][class_name]), class_name)
    return set(public_method_names(cls))


@pytest.mark.parametrize("case", CORPUS, ids=[c[2][:40] for c in CORPUS])
def test_hostile_call_returns_within_the_limit_and_the_episode_goes_on(sandbox, case):
    task_id, setup, hostile, normal = case
    episode = Episode(get_task(task_id), sandbox=sandbox)
    episode.begin_turn()
    for call in setup:
        assert episode.step(call).ok == [True], call
    before = episode.state()
    step, cpu = with_cpu(sandbox, episode.step, hostile)
    assert cpu < LIMIT + SLACK
    assert len(step.observations) == 1
    if step.observations[0].startswith(KILLED):
        assert episode.state() == before  # the overrun call left no trace
    after = episode.step(normal)
    assert after.ok == [True] and not after.observations[0].startswith("Error")


def test_cpu_bound_calls_time_out_and_state_survives(sandbox):
    episode = Episode(get_task(MATH), sandbox=sandbox)
    episode.begin_turn()
    restarts = sandbox.restarts
    for hostile in (POWER, LOG):
        step, cpu = with_cpu(sandbox, episode.step, hostile)
        assert step.observations == ["Error during execution: timed out after 1s"]
        assert step.overran == [True] and step.ok == [False]
        assert cpu < LIMIT + SLACK
    assert sandbox.restarts == restarts + 2  # killed and replaced twice
    assert episode.step("add(a=2, b=3)").observations == ['{"result": 5}']


def test_one_overrun_ends_the_step_so_a_message_of_hostile_calls_costs_one_limit(sandbox):
    episode = Episode(get_task(MATH), sandbox=sandbox)
    episode.begin_turn()
    step, cpu = with_cpu(
        sandbox, episode.step, "[" + ", ".join([POWER] * 10 + ["add(a=1, b=1)"]) + "]"
    )
    assert cpu < LIMIT + SLACK
    assert step.observations[0] == "Error during execution: timed out after 1s"
    assert set(step.observations[1:]) == {STEP_ENDED} and step.overran == [True] * 11
    assert episode.step("add(a=2, b=2)").observations == ['{"result": 4}']


HOG = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass"  # ends with us
ROOT = "square_root(number=2, precision=30000)"  # a legitimate call: ~0.2 s of CPU


def cpu_of(call: str) -> tuple[LocalEpisode, float]:
    """An in-process Math episode that ran `call` once, and the CPU seconds the call took."""
    local = LocalEpisode(get_task(MATH))
    local.begin_turn()
    start = time.process_time()
    assert local.step(call).ok == [True]
    return local, time.process_time() - start


def test_a_busy_cpu_slows_calls_down_but_does_not_time_them_out():
    """The limits count the worker's own time in the model's calls, not its start or the box's
    load. The first call starts the worker, under a 4.5c s message budget; then the worker
    shares one CPU with 2 busy loops (a third of it at most: >= 3c s of wall for a call of c s
    of CPU): a call under a 2.5c limit gets its answer, and so does a message of two under the
    4.5c budget (>= 6c of wall). With wall-clock limits, on a busy box the first was "not run:
    time budget" (the worker's start spent the budget) and the others were killed. The margins
    are measured: at load 6-9 the same call took 0.86-1.52 c of CPU in the worker."""
    local, c = cpu_of(ROOT)
    cpu = min(os.sched_getaffinity(0))
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(2)]
    box = Sandbox(EnvConfig(tool_timeout_s=2.5 * c, message_timeout_s=4.5 * c))
    try:
        episode = Episode(get_task(MATH), sandbox=box)
        episode.begin_turn()
        assert episode.step("add(a=1, b=1)").ok == [True]  # the worker is up, its classes loaded
        for pid in (box.pid(), *(h.pid for h in hogs)):
            os.sched_setaffinity(pid, {cpu})
        step = episode.step(ROOT)
        assert step.ok == [True] and step.observations == local.step(ROOT).observations
        step = episode.step(f"[{ROOT}, {ROOT}]")
        assert step.ok == [True, True] and box.restarts == 0
        assert episode.tool_seconds < 6 * c  # ~3c the calls took, not the >= 9c they waited
    finally:
        box.close()
        for hog in hogs:
            hog.kill()
            hog.wait()


def test_a_call_waiting_for_a_cpu_is_not_killed_for_that_wait():
    """The kernel adds a wait for a CPU to the worker's run_delay only when the wait ends, so a
    look at its clock during a wait counts the wait as the call's own time. A worker at nice 19
    pinned beside a busy loop waits ~0.1 s between its turns on the CPU; a call of c s of CPU
    under a 3c limit was killed ("timed out after ...") on such a look. Now it gets its answer:
    a kill waits until the worker has run since the look, or is blocked."""
    call = "square_root(number=2, precision=8000)"  # ~0.03 s of CPU
    local, c = cpu_of(call)
    cpu = min(os.sched_getaffinity(0))
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    box = Sandbox(EnvConfig(tool_timeout_s=3 * c, message_timeout_s=100))
    try:
        episode = Episode(get_task(MATH), sandbox=box)
        episode.begin_turn()
        assert episode.step("add(a=1, b=1)").ok == [True]
        for pid in (box.pid(), hog.pid):
            os.sched_setaffinity(pid, {cpu})
        os.setpriority(os.PRIO_PROCESS, box.pid(), 19)
        step = episode.step(call)
        assert step.observations == local.step(call).observations and box.restarts == 0
    finally:
        box.close()
        hog.kill()
        hog.wait()


def test_a_look_past_the_limit_settles_once_the_worker_has_run():
    """Hand-computed looks (ns). The worker's run_delay is 100 at t=600; it is put in the run
    queue at 600 and waits until 1,400, then runs. A look at 1,000 still says run_delay 100: own
    900, 400 too much. It settles after the worker has run (a look at 1,600, run_delay 900):
    its own clock is at least 1,000 - 900 = 100."""
    from rcgrpo.bfcl.progress import Reading, settled

    first = Reading(at=1_000, own=900, cpu=50, runs=3, exact=False)
    assert settled(None, first) is None  # a first look in the run queue proves nothing
    still_waiting = Reading(at=1_300, own=1_200, cpu=50, runs=3, exact=False)
    assert settled(first, still_waiting) is None
    has_run = Reading(at=1_600, own=700, cpu=250, runs=4, exact=False)
    assert settled(first, has_run) == 100
    blocked = Reading(at=1_700, own=800, cpu=250, runs=4, exact=True)  # no wait can be pending
    assert settled(first, blocked) == 800 and settled(None, blocked) == 800


def test_memory_limit_gives_out_of_memory_and_keeps_the_state():
    box = Sandbox(EnvConfig(tool_timeout_s=20.0, tool_memory_mb=1024))
    try:
        episode = Episode(get_task(FS), sandbox=box)
        episode.begin_turn()
        episode.step("mkdir(dir_name='kept')")
        # (the call is not in the FS task; a Math task's episode shares the worker)
        math = Episode(get_task(MATH), sandbox=box)
        math.begin_turn()
        step, cpu = with_cpu(box, math.step, "square_root(number=2, precision=10000000000)")
        assert step.observations == ["Error during execution: out of memory (limit 1024 MiB)"]
        assert cpu < 10  # 10^10 digits: ended by the memory limit, long before the time limit
        assert "kept" in episode.step("ls()").observations[0]  # other episode rebuilt by replay
    finally:
        box.close()


def test_kill_9_of_the_worker_between_calls_is_invisible_to_the_episode(sandbox):
    episode = Episode(get_task(FS), sandbox=sandbox)
    episode.begin_turn()
    episode.step("cd(folder='document')")
    episode.step("mkdir(dir_name='temp')")
    fds = len(os.listdir("/proc/self/fd"))
    os.kill(sandbox.pid(), signal.SIGKILL)
    time.sleep(0.2)
    assert episode.step("pwd()").observations == [
        '{"current_working_directory": "/workspace/document"}'
    ]
    assert "temp" in episode.step("ls()").observations[0]
    # the death is on record with its signal, and the dead worker's pipes and clock are closed
    assert sandbox.replaced[-1] == "between requests: the tool process died (exit status -9)"
    assert len(os.listdir("/proc/self/fd")) == fds


def test_kill_9_during_a_call_fails_that_call_only():
    box = Sandbox(EnvConfig(tool_timeout_s=30.0))
    try:
        episode = Episode(get_task(MATH), sandbox=box)
        episode.begin_turn()
        episode.step("add(a=1, b=1)")
        pid = box.pid()
        killer = threading.Timer(0.5, os.kill, (pid, signal.SIGKILL))
        killer.start()
        step = episode.step(POWER)
        killer.join()
        assert step.observations == [  # not "timed out after 30s": the death ended the wait
            "Error during execution: the tool process died (exit status -9)"
        ]
        assert box.pid() != pid
        assert episode.step("add(a=2, b=2)").observations == ['{"result": 4}']
    finally:
        box.close()


def test_a_worker_outlives_the_thread_that_started_it():
    """A sandbox shared by threads (the rollout's SandboxPool, one thread per episode in flight):
    its worker is started by the first thread that uses it, and that thread ends while another
    thread's call runs. The kernel's parent-death signal follows the thread that forked the
    worker, not the process; the call must still get its own result."""
    box = Sandbox(EnvConfig(tool_timeout_s=60.0))
    started, go, ended = threading.Event(), threading.Event(), []

    def first_user():
        Episode(get_task(MATH), sandbox=box).step("add(a=1, b=1)")
        started.set()
        go.wait(timeout=120)
        ended.append(time.monotonic())  # and the thread ends

    def end_it_once_the_call_runs(pid: int):
        try:
            base = proc_cpu(pid)
            while proc_cpu(pid) < base + 0.05:  # the worker is computing power()
                time.sleep(0.005)
        finally:
            go.set()

    starter = threading.Thread(target=first_user)
    starter.start()
    try:
        assert started.wait(timeout=120)
        pid = box.pid()
        watcher = threading.Thread(target=end_it_once_the_call_runs, args=(pid,))
        watcher.start()
        step = Episode(get_task(MATH), sandbox=box).step("power(base=3, exponent=3000000)")
        done = time.monotonic()
        starter.join()
        watcher.join()
        assert ended and ended[0] < done  # the first user ended while the call ran
        assert "the tool process died" not in step.observations[0], step.observations
        assert box.replaced == [] and box.pid() == pid
    finally:
        go.set()
        box.close()


OWNER = f"""
import threading
from rcgrpo.bfcl.environment import Episode
from rcgrpo.bfcl.sandbox import Sandbox
from rcgrpo.bfcl.tasks import get_task
from rcgrpo.envs.config import EnvConfig
box = Sandbox(EnvConfig(tool_timeout_s=600.0))
def run():  # a thread of the owner starts the worker and keeps it busy for minutes
    Episode(get_task("{MATH}"), sandbox=box).step("add(a=1, b=1)")
    print(box.pid(), flush=True)
    Episode(get_task("{MATH}"), sandbox=box).step("{POWER}")
threading.Thread(target=run).start()
"""


def test_a_kill_9_of_the_owner_ends_its_busy_worker():
    """The worker outlives the threads of its owner, not the owner: kill -9 of a process whose
    worker (started from one of its threads) is in the middle of a long call ends the worker."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    worker = None
    try:
        worker = int(owner.stdout.readline())
        base, deadline = proc_cpu(worker), time.monotonic() + 60
        while proc_cpu(worker) < base + 0.1 and time.monotonic() < deadline:
            time.sleep(0.01)  # until power() runs
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        deadline = time.monotonic() + 10
        while alive(worker) and time.monotonic() < deadline:  # a zombie is not alive
            time.sleep(0.05)
        assert not alive(worker), "the busy worker outlived its owner by 10 s"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        owner.stdout.close()


def test_scoring_a_trajectory_with_a_hostile_call_does_not_hang(sandbox):
    task = get_task(MATH)
    calls = ground_truth_calls(task)
    first = next(i for i, t in enumerate(calls) if t)
    calls[first] = [[POWER], *calls[first]]  # a hostile step before the right calls
    (paper, bfcl), cpu = with_cpu(sandbox, score, task, calls, sandbox=sandbox)
    assert cpu < LIMIT + SLACK
    assert paper.passed and bfcl.passed  # the overrun changed nothing; the replay went on


def test_a_batch_scores_as_one_request_per_trajectory_even_with_a_hostile_call(sandbox):
    """score_many (how a rollout batch is scored) gives each trajectory the verdicts `score`
    gives it alone; a hostile call in the middle item is killed, and only that call is skipped:
    the items before and after it (model calls numbered across the batch) are unchanged."""
    tasks = [get_task(t) for t in (MATH, FS, TRADE, TRAVEL)]
    items = [(task, traj) for task, _, traj in cases(tasks, 2, 0)]  # passing and failing ones
    hostile = ground_truth_calls(tasks[0])
    first = next(i for i, t in enumerate(hostile) if t)
    hostile[first] = [[POWER], *hostile[first]]
    items.insert(len(items) // 2, (tasks[0], hostile))
    alone = [score(task, traj, sandbox=sandbox) for task, traj in items]
    restarts = sandbox.restarts
    batched, cpu = with_cpu(sandbox, score_many, items, sandbox=sandbox)
    assert cpu < LIMIT + SLACK
    assert sandbox.restarts == restarts + 1  # one kill, for the one hostile call
    assert batched == alone
    assert {v.passed for pair in alone for v in pair} == {True, False}  # both kinds are in it
    assert batched[len(items) // 2][0].passed  # the overrun changed nothing


def test_a_failure_of_our_own_code_in_the_worker_is_raised_and_the_worker_survives(sandbox):
    task = get_task(MATH)
    pid = sandbox.pid()
    with pytest.raises(SandboxError, match="TypeError"):
        score(task, [[[12345]]], sandbox=sandbox)  # not a call string
    assert sandbox.pid() == pid
    assert score(task, ground_truth_calls(task), sandbox=sandbox)[0].passed


def test_a_mark_read_in_the_middle_of_its_write_is_not_taken_for_an_overrun():
    """The worker writes a call's mark as five stores and can be preempted between them (a busy
    box). A parent that read the new call index with the previous start (0 right after a worker
    starts) took a call that had not begun for one long overrun and killed it: its observation
    became "timed out". Hand-made states."""
    import mmap

    from rcgrpo.bfcl import progress

    memory = mmap.mmap(-1, progress.SIZE)
    progress.write(memory, progress.IDLE, 1_000, 0, progress.NO_DEADLINE, 0)
    assert progress.read(memory) == (progress.IDLE, 1_000, 0, progress.NO_DEADLINE, 0)
    seq = progress.SEQ.unpack_from(memory, 0)[0]  # the next mark begins: counter odd ...
    progress.SEQ.pack_into(memory, 0, seq + 1)
    progress.SEQ.pack_into(memory, progress.SEQ.size, 0)  # ... and call 0's index, not its start
    assert progress.read(memory) is None  # "read again", never (call 0, started at 1,000 ns)
    progress.RECORD.pack_into(memory, progress.SEQ.size, 0, 5_000, 0, progress.NO_DEADLINE, 4_000)
    progress.SEQ.pack_into(memory, 0, seq + 2)  # the writer goes on and finishes the mark
    assert progress.read(memory) == (0, 5_000, 0, progress.NO_DEADLINE, 4_000)


def test_limits_come_from_params_yaml_and_bad_values_are_refused():
    import yaml

    from rcgrpo.config import ConfigError, load_section, params_path

    section = yaml.safe_load(params_path().read_text())["env"]
    assert configured() == EnvConfig(**section)
    with pytest.raises(ConfigError, match=r"env.tool_timeout_s=0: must be in \(0, inf\)"):
        load_section("env", EnvConfig, overrides={"tool_timeout_s": 0})
    with pytest.raises(ConfigError, match="unknown key"):
        load_section("env", EnvConfig, overrides={"timeout": 1})


CHILD = f"""
import json, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_sandbox import with_cpu
from rcgrpo.bfcl.environment import Episode
from rcgrpo.bfcl.tasks import get_task
from rcgrpo.bfcl import limits, sandbox
from rcgrpo.config import parse_sets
from rcgrpo.run_config import resolve
rc = resolve(None, sets=parse_sets(["env.tool_timeout_s=0.5", "execution.workers=3"], True))
limits.use(rc.env)  # what the stage entry (rcgrpo.tracking.stage.run_stage) does first
# its tool workers are children of this one: the killed one and its replacement
step, cpu = with_cpu(sandbox.default(), Episode(get_task("{MATH}")).step, "{POWER}")
print(json.dumps([step.observations[0], cpu, rc.execution.workers]))
"""


def test_set_env_reaches_the_tool_worker_and_bad_values_fail_at_once():
    """`rcgrpo run --set env.tool_timeout_s=0.5`: the CLI checks the pair, the run's resolved
    `env:` is handed to the sandbox, and the tool worker it starts kills `power` after 0.5 s,
    not params.yaml's 5 s: the workers' CPU time (their starts included, not the box's load)
    stays under what 5 s of `power` alone would take."""
    from rcgrpo.config import ConfigError, parse_sets

    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    observation, cpu, workers = json.loads(out.stdout.strip().splitlines()[-1])
    assert observation == "Error during execution: timed out after 0.5s"
    assert cpu < 0.5 + SLACK < 5 and workers == 3
    with pytest.raises(ConfigError, match=r"^env.tool_timeout_s=0: must be in \(0, inf\)$"):
        parse_sets(["env.tool_timeout_s=0"], sectioned=True)
    with pytest.raises(ConfigError, match="did you mean 'tool_timeout_s'"):
        parse_sets(["env.tool_timeout=1"], sectioned=True)
    with pytest.raises(ConfigError, match="must be an int"):
        parse_sets(["execution.workers=many"], sectioned=True)


@pytest.mark.slow
def test_env_run_cli_returns_on_cpu_bound_calls(tmp_path: Path):
    calls = tmp_path / "calls.json"
    calls.write_text(json.dumps([[POWER, LOG, "add(a=1, b=2)"]]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(  # a hang's guard: 2 overruns of 5 s of own time are minutes of wall
        [sys.executable, "-m", "rcgrpo.cli", "env", "run", MATH, "--calls", str(calls)],
        capture_output=True, text=True, timeout=900,  # at load 30 on 2 cores
    )  # fmt: skip
    cpu = cpu_seconds(before)  # the command's and its tool workers' (it waits for them)
    assert out.returncode == 0, out.stderr[-2000:]
    steps = json.loads(out.stdout)["turns"][0]["steps"]
    timeout = configured().tool_timeout_s
    assert [s["observations"] for s in steps] == [
        [f"Error during execution: timed out after {timeout:g}s"],
        [f"Error during execution: timed out after {timeout:g}s"],
        ['{"result": 3}'],
    ]
    assert cpu < 2 * timeout + 30  # 2 overruns; the scoring leaves killed calls out
