"""Episodes: fresh bfcl-eval instances, state across turns, miss_func reveal, step limit, threads."""

import json
import pickle
import re
from concurrent.futures import ThreadPoolExecutor

from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.gorilla_file_system import (
    GorillaFileSystem,
)

from rcgrpo.bfcl.environment import STEP_LIMIT, Episode
from rcgrpo.bfcl.tasks import REVEAL_MESSAGE, get_task


def test_instances_are_bfcl_eval_classes_loaded_with_the_initial_config():
    episode = Episode(get_task("multi_turn_base_0"))
    fs = episode.instances["GorillaFileSystem"]
    assert type(fs) is GorillaFileSystem
    episode.begin_turn()
    assert episode.step("ls()").observations == [
        '{"current_directory_content": ["document", "archive"]}'
    ]


def test_state_is_kept_across_turns_and_never_shared_between_episodes():
    task = get_task("multi_turn_base_0")
    first, second = Episode(task), Episode(task)
    first.begin_turn()
    first.step("cd(folder='document')")
    first.step("mkdir(dir_name='temp')")
    first.begin_turn()
    assert first.step("pwd()").observations == [
        '{"current_working_directory": "/workspace/document"}'
    ]
    assert "temp" in first.step("ls()").observations[0]
    second.begin_turn()
    assert second.step("pwd()").observations == ['{"current_working_directory": "/workspace"}']
    assert "temp" not in str(task.initial_config)  # the task itself is untouched


def test_long_context_flag_loads_the_long_context_scenario():
    base = Episode(get_task("multi_turn_base_0")).state()
    long = Episode(get_task("multi_turn_long_context_0")).state()
    assert len(pickle.dumps(long)) > 5 * len(pickle.dumps(base))


def test_miss_func_hides_the_function_until_its_reveal_turn():
    task = get_task("multi_turn_miss_func_0")  # `sort` is revealed at turn 3
    episode = Episode(task)
    for _ in range(3):
        episode.begin_turn()
        assert "sort" not in episode.available()
        assert "sort" not in {d["name"] for d in episode.tool_docs()}
    step = episode.step("sort(file_name='final_report.pdf')")
    assert step.observations == ["Error during execution: function 'sort' is not available"]
    assert episode.begin_turn() == [{"role": "user", "content": REVEAL_MESSAGE}]
    assert episode.revealed_now() == ["sort"] and "sort" in episode.available()
    assert "sort" in {d["name"] for d in episode.tool_docs()}


def test_step_limit_counts_model_steps_per_turn():
    episode = Episode(get_task("multi_turn_base_0"))
    episode.begin_turn()
    assert episode.step_limit == STEP_LIMIT == 20
    for _ in range(STEP_LIMIT):
        episode.step("pwd()")
    assert episode.steps_left == 0
    episode.begin_turn()
    assert episode.steps_left == STEP_LIMIT


def _walk(i: int) -> str:
    episode = Episode(get_task("multi_turn_base_0"))
    episode.begin_turn()
    episode.step(f"mkdir(dir_name='d{i}')")
    return episode.step("ls()").observations[0]


def test_thousands_of_episodes_from_several_threads_stay_independent():
    with ThreadPoolExecutor(max_workers=8) as pool:
        listings = list(pool.map(_walk, range(2000)))
    for i, listing in enumerate(listings):
        assert re.findall(r'"d\d+"', listing) == [f'"d{i}"']


def test_mutable_tool_defaults_do_not_leak_between_episodes():
    # bfcl-eval's post_tweet(tags=[], mentions=[]) keeps the default list; mention() extends it.
    task = get_task("multi_turn_base_0")
    login = "authenticate_twitter(username='analyst_pro', password='Kj8#mP9$vL2')"
    first = Episode(task)
    first.begin_turn()
    first.step(login)
    posted = first.step("post_tweet(content='first')").observations[0]
    tweet_id = json.loads(posted)["id"]
    first.step(f"mention(tweet_id={tweet_id}, mentioned_usernames=['@alice'])")
    second = Episode(task)
    second.begin_turn()
    second.step(login)
    assert json.loads(second.step("post_tweet(content='second')").observations[0])["mentions"] == []
