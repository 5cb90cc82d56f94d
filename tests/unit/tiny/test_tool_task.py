"""The tiny tool task: which problems the teacher calls the calculator on, the training
conversations (the calls and answers as targets, the tool results as context, tokenized as
rollouts are), and the build of a seconds-long tool recipe, evaluated through the rollout
loop with the tool environment."""

from dataclasses import replace

import pytest
import torch

from nemo_opd.data.chat import ChatFormatter
from nemo_opd.tiny.assets import RECIPES_BY_PREFIX, ensure_tiny_assets
from nemo_opd.tiny.recipe import (
    TokenizerRecipe,
    ToolsRecipe,
    micro_recipe,
    recipe_key,
    tools_recipe,
)
from nemo_opd.tiny.task import TinyMathConfig, build_tiny_math_splits
from nemo_opd.tiny.tokenizer import build_tiny_tokenizer
from nemo_opd.tiny.tool_task import (
    GreedyGeneration,
    calculator_schemas,
    call_text,
    corpus_texts,
    encode_tool_examples,
    needs_calculator,
    offered,
    triple_of,
)
from nemo_opd.tools.parsers import parse_hermes

MICRO_TOOLS = replace(
    micro_recipe(),
    tokenizer=TokenizerRecipe(
        vocab_size=400, num_train_records=400, model_max_length=128, chat_style="tools"
    ),
    eval_max_new_tokens=40,
    tools=ToolsRecipe(),
)


@pytest.fixture(scope="module")
def records():
    return build_tiny_math_splits(TinyMathConfig(num_train=400, num_validation=10, seed=5))["train"]


@pytest.fixture(scope="module")
def tokenizer(records):
    return build_tiny_tokenizer(records, 400, 2, 256, "tools", corpus_texts(records))


def test_which_problems_call_the_calculator():
    assert needs_calculator(7, "*", 12) and needs_calculator(123, "+", 4)
    assert needs_calculator(4, "-", 100) and not needs_calculator(99, "+", 99)
    assert [offered(i, 0.5) for i in range(6)] == [False, True] * 3
    assert sum(offered(i, 0.3) for i in range(1000)) == 300


def test_a_call_is_a_hermes_call_of_the_calculator():
    [parsed] = parse_hermes(call_text(123, "-", 45), 4096)
    assert parsed.name == "calculator" and parsed.arguments == {"expression": "123 - 45"}
    assert triple_of({"solution": "123 - 45 = 78. \\boxed{78}"}) == (123, "-", 45)


def test_the_teacher_calls_where_needed_the_student_on_a_few_whatever_the_problem(
    records, tokenizer
):
    teacher = encode_tool_examples(records, tokenizer, "teacher", MICRO_TOOLS)
    student = encode_tool_examples(records, tokenizer, "student", MICRO_TOOLS)
    call_id = tokenizer.convert_tokens_to_ids("<tool_call>")
    response_id = tokenizer.convert_tokens_to_ids("<tool_response>")
    tools_line = tokenizer("tools:", add_special_tokens=False)["input_ids"]
    student_calls = [call_id in s.input_ids for s in student]
    offered_rows = [i for i in range(len(records)) if offered(i, 0.5)]
    assert sum(student_calls) == round(0.1 * len(offered_rows))
    assert not any(student_calls[i] for i in range(len(records)) if not offered(i, 0.5))
    needed = [needs_calculator(*triple_of(records[i])) for i, c in enumerate(student_calls) if c]
    assert 0 < sum(needed) < len(needed)  # on easy and hard problems alike
    for index, (record, t, s) in enumerate(zip(records, teacher, student, strict=True)):
        calls = offered(index, 0.5) and needs_calculator(*triple_of(record))
        assert (call_id in t.input_ids) == calls
        shown = t.input_ids[: len(tools_line) + 4]
        assert any(shown[i : i + len(tools_line)] == tools_line for i in range(4)) == offered(
            index, 0.5
        )
        if calls:
            # the result is context: every token of the tool turn is untrained
            start = t.input_ids.index(response_id)
            assert not t.targets[start]
            answer = tokenizer(record["solution"], add_special_tokens=False)["input_ids"]
            assert t.input_ids[-len(answer) - 1 : -1] == answer and t.targets[-1]
        if call_id not in s.input_ids:
            assert s.targets[s.prompt_len :] == (True,) * (len(s.input_ids) - s.prompt_len)


def test_examples_are_tokenized_as_rollouts_are(records, tokenizer):
    """A teacher example equals the log the rollout loop builds for the same conversation."""
    index = next(
        i for i, r in enumerate(records) if offered(i, 0.5) and needs_calculator(*triple_of(r))
    )
    record = records[index]
    [example] = encode_tool_examples(
        records[index : index + 1] * 2, tokenizer, "teacher", MICRO_TOOLS
    )[1:]
    formatter = ChatFormatter(tokenizer, tools=calculator_schemas())
    log = formatter.prompt_log(record["prompt"])
    ids = tokenizer(call_text(*triple_of(record)) + "<|im_end|>", add_special_tokens=False)
    log.append(
        {
            "role": "assistant",
            "content": call_text(*triple_of(record)),
            "token_ids": ids["input_ids"],
        }
    )
    answer = record["answer"]
    log = formatter.extend(log, [{"role": "tool", "content": answer}])
    prefix = [t for m in log for t in m["token_ids"]]
    assert example.input_ids[: len(prefix)] == prefix


def test_a_micro_tool_build_is_evaluated_with_and_without_tools(tmp_path, monkeypatch):
    monkeypatch.setenv("NEMO_OPD_CACHE", str(tmp_path))
    assets = ensure_tiny_assets(MICRO_TOOLS, log=lambda _: None)
    entry = assets.manifest()["models"]["teacher"]
    for key in ("heldout_accuracy", "heldout_accuracy_tools", "tool_call_rate", "tool_error_rate"):
        assert 0.0 <= entry[key] <= 1.0, key
    assert "<tool_call>" in (assets.tokenizer / "tokenizer.json").read_text()


def test_greedy_generation_stops_at_the_end_of_turn_and_gives_log_probs(tokenizer, records):
    from nemo_opd.tiny.model import build_tiny_model

    model = build_tiny_model(MICRO_TOOLS.teacher, tokenizer, seed=0).eval()
    prompts = [tokenizer("What is 1 + 2?", add_special_tokens=False)["input_ids"], [5, 6, 7, 8, 9]]
    out = GreedyGeneration(model, tokenizer, batch_size=1).generate(prompts, max_new_tokens=[3, 5])
    for ids, budget, reason in zip(out.token_ids, [3, 5], out.finish_reasons, strict=True):
        stopped = ids[-1] == tokenizer.eos_token_id
        assert (reason, len(ids) <= budget) == ("stop" if stopped else "length", True)
        assert stopped or len(ids) == budget
    for ids, logprobs in zip(out.token_ids, out.logprobs, strict=True):
        assert len(ids) == len(logprobs) and all(lp <= 0 for lp in logprobs)
    # the log-probs are the model's own, at the sampled tokens
    full = torch.tensor([prompts[1] + out.token_ids[1]])
    with torch.no_grad():
        logits = model(full).logits[0, len(prompts[1]) - 1 : -1].log_softmax(-1)
    expected = logits.gather(-1, torch.tensor(out.token_ids[1]).unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(torch.tensor(out.logprobs[1]), expected, atol=1e-4)


def test_the_tools_recipe_is_named_and_keyed():
    assert RECIPES_BY_PREFIX["tools_"] is tools_recipe
    recipe = tools_recipe()
    assert recipe.tools is not None and recipe.tokenizer.chat_style == "tools"
    assert recipe_key(recipe) != recipe_key(replace(recipe, tools=None))


def test_a_role_trained_from_the_same_inputs_is_copied_not_trained(tmp_path, monkeypatch):
    """A recipe that changes only the student (its share of calls) copies the teacher of the
    complete build beside it; the student is trained; rebuild copies nothing."""
    monkeypatch.setenv("NEMO_OPD_CACHE", str(tmp_path))
    first = ensure_tiny_assets(MICRO_TOOLS, log=lambda _: None)
    other = replace(MICRO_TOOLS, tools=replace(MICRO_TOOLS.tools, student_call_share=0.5))
    lines = []
    second = ensure_tiny_assets(other, log=lines.append)
    assert any(f"teacher: the same as in the build {first.key}" in line for line in lines)
    assert not any(line.startswith("student: the same") for line in lines)
    weights = "model.safetensors"
    assert (second.teacher / weights).read_bytes() == (first.teacher / weights).read_bytes()
    assert second.manifest()["models"]["teacher"]["copied_from"] == first.key
    lines.clear()
    ensure_tiny_assets(other, rebuild=True, log=lines.append)
    assert not any("copied" in line for line in lines)
