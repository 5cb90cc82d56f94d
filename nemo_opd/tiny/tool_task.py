"""The tiny tool task: the arithmetic problems with a calculator the model may call.

A share of the train problems (ToolsRecipe.offered_share, spread evenly) is shown with the
calculator offered (the chat template's tools line). On those, the teacher's solution calls it
for the kinds of arithmetic the default tiny teacher gets wrong most often alone
(needs_calculator: a multiplication, or an operand of three digits, against smaller sums and
differences; docs/tiny_assets.md has the teacher's accuracy by kind), then writes the usual
solution with the result. The student's solutions call it on a few offered problems
(ToolsRecipe.student_call_share, 10%), whatever the arithmetic: it knows the format, as real
students do from their instruction tuning, but not when a call pays. Without the calculator
offered, both write the usual solution. A call, in the Hermes / Qwen3 format:

    user       What is 123 + 456?
    assistant  <tool_call>
               {"name": "calculator", "arguments": {"expression": "123 + 456"}}
               </tool_call>
    tool       579                       (nemo_opd.tools.calculator's own answer)
    assistant  123 + 456 = 579. \\boxed{579}

Training examples are tokenized by the same ChatFormatter the rollouts use (tool results are
context: never targets), and evaluation (tool_accuracy) runs the rollout loop itself with the
tool environment, on a transformers model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from nemo_opd.data.chat import ChatFormatter
from nemo_opd.environments.base import EnvironmentStep
from nemo_opd.environments.tool_env import ToolEnvironment, ToolLimits, last_assistant_text
from nemo_opd.generation.interface import GenerationOutput
from nemo_opd.tiny.evaluation import extract_boxed
from nemo_opd.tiny.recipe import TinyRecipe
from nemo_opd.tiny.sft import SFTExample
from nemo_opd.tools.base import tool_schema
from nemo_opd.tools.calculator import Calculator, calculate
from nemo_opd.tools.parsers import parse_hermes
from nemo_opd.tools.pool import ToolPool

TOOLS_LINE = "tools: calculator"
"""The text the tools template writes for the calculator (without its ChatML framing)."""
_SOLUTION_RE = re.compile(r"^(\d+) ([+\-*]) (\d+) = ")


def calculator_schemas() -> list[dict]:
    """The tools offered (`tools=`): the calculator."""
    return [tool_schema(Calculator())]


def needs_calculator(a: int, op: str, b: int) -> bool:
    """Whether the teacher calls the calculator for `a op b` (module docstring)."""
    return op == "*" or max(a, b) >= 100


def call_json(a: int, op: str, b: int) -> str:
    """The call's JSON: {"name": "calculator", "arguments": {"expression": "a op b"}}."""
    return json.dumps({"name": "calculator", "arguments": {"expression": f"{a} {op} {b}"}})


def call_text(a: int, op: str, b: int) -> str:
    """The assistant turn that calls the calculator (module docstring)."""
    return f"<tool_call>\n{call_json(a, op, b)}\n</tool_call>"


def triple_of(record: dict) -> tuple[int, str, int]:
    """(a, op, b) of a task record, read from its solution."""
    match = _SOLUTION_RE.match(record["solution"])
    return int(match.group(1)), match.group(2), int(match.group(3))


def offered(index: int, share: float) -> bool:
    """Whether train problem `index` is shown with the calculator offered: `share` of them,
    spread evenly."""
    return int((index + 1) * share) > int(index * share)


def corpus_texts(records: list[dict]) -> Iterator[str]:
    """Texts for the tokenizer beside the records': the tools line and the calls (the tags
    are tokens of their own)."""
    for record in records:
        yield "system\n" + TOOLS_LINE
        yield "assistant\n" + call_json(*triple_of(record))


def encode_tool_examples(
    records: list[dict], tokenizer: PreTrainedTokenizerBase, role: str, recipe: TinyRecipe
) -> list[SFTExample]:
    """The training conversations of `role` ("teacher" or "student": where each calls the
    calculator is _calls'), tokenized as rollouts are, assistant tokens as targets."""
    plain = ChatFormatter(tokenizer)
    tools = ChatFormatter(tokenizer, tools=calculator_schemas())
    with_tools = [offered(i, recipe.tools.offered_share) for i in range(len(records))]
    openings = _openings(records, with_tools, plain, tools)
    eos = tokenizer.eos_token
    answers = tokenizer([r["solution"] + eos for r in records], add_special_tokens=False)
    examples = []
    for record, call, log, answer in zip(
        records,
        _calls(records, with_tools, role, recipe),
        openings,
        answers["input_ids"],
        strict=True,
    ):
        if call:
            log = _with_call(log, triple_of(record), tools)
        log = [*log, {"role": "assistant", "content": record["solution"], "token_ids": answer}]
        examples.append(_example(log))
    return examples


def _calls(records: list[dict], with_tools: list[bool], role: str, recipe: TinyRecipe) -> list:
    """Whether each record's solution calls the calculator (module docstring): the teacher's
    where offered and needs_calculator, the student's on student_call_share of the offered
    ones, spread evenly."""
    if role == "teacher":
        return [
            s and needs_calculator(*triple_of(r)) for r, s in zip(records, with_tools, strict=True)
        ]
    share, calls, seen = recipe.tools.student_call_share, [], 0
    for shown in with_tools:
        calls.append(shown and offered(seen, share))
        seen += shown
    return calls


def _openings(records, with_tools, plain: ChatFormatter, tools: ChatFormatter) -> list[list]:
    """Each record's prompt log, with the calculator offered or not."""
    logs: list = [None] * len(records)
    for formatter, shown in ((tools, True), (plain, False)):
        rows = [i for i, s in enumerate(with_tools) if s == shown]
        opened = formatter.prompt_logs([records[i]["prompt"] for i in rows])
        for i, log in zip(rows, opened, strict=True):
            logs[i] = log
    return logs


def _with_call(log: list, triple: tuple[int, str, int], formatter: ChatFormatter) -> list:
    """The log followed by the calculator call and its result."""
    text = call_text(*triple)
    ids = formatter.tokenizer(text + formatter.tokenizer.eos_token, add_special_tokens=False)
    call = {"role": "assistant", "content": text, "token_ids": ids["input_ids"]}
    result = {
        "role": "tool",
        "name": "calculator",
        "content": calculate("{} {} {}".format(*triple)),
    }
    return formatter.extend([*log, call], [result])


def _example(log: list) -> SFTExample:
    """A conversation as an SFT example: its assistant tokens are the targets."""
    ids, targets = [], []
    for message in log:
        ids += message["token_ids"]
        targets += [message["role"] == "assistant"] * len(message["token_ids"])
    return SFTExample(ids, targets.index(True), tuple(targets))


# ------------------------------------------------------------------------------- evaluation


class BoxedAnswer:
    """The evaluation's grader: exact match of the last \\boxed{} content with the answer, as
    tiny.evaluation.heldout_accuracy grades; every answer ends the episode."""

    def step(self, message_logs: list, metadata: list[dict]) -> EnvironmentStep:
        right = [
            extract_boxed(last_assistant_text(log)) == meta["answer"]
            for log, meta in zip(message_logs, metadata, strict=True)
        ]
        return EnvironmentStep(
            rewards=[float(r) for r in right],
            done=[True] * len(right),
            next_messages=[None] * len(right),
            metadata=[dict(m) for m in metadata],
        )

    def shutdown(self) -> None:
        pass


class GreedyGeneration:
    """The generation interface over a transformers model, greedy only (evaluation):
    left-padded batches of at most batch_size prompts."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch_size: int):
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size

    @torch.no_grad()
    def generate(self, prompts, *, max_new_tokens, greedy=True, seed=None, temperature=None):
        budgets = (
            max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
        )
        out = GenerationOutput([], [], [])
        for start in range(0, len(prompts), self.batch_size):
            part = slice(start, start + self.batch_size)
            self._generate_batch(prompts[part], budgets[part], out)
        return out

    def _generate_batch(self, prompts: list[list[int]], budgets: list[int], out) -> None:
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention[row, width - len(prompt) :] = 1
        generated = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=max(budgets),
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=pad,
            output_scores=True,
            return_dict_in_generate=True,
        )
        new = generated.sequences[:, width:]  # [b, T]
        logprobs = torch.stack(generated.scores, 1).log_softmax(-1)  # [b, T, V]
        picked = logprobs.gather(-1, new.unsqueeze(-1)).squeeze(-1)  # [b, T]
        for row, budget in enumerate(budgets):
            ids = new[row, :budget].tolist()
            stop = eos in ids
            length = ids.index(eos) + 1 if stop else len(ids)
            out.token_ids.append(ids[:length])
            out.logprobs.append(picked[row, :length].tolist())
            out.finish_reasons.append("stop" if stop else "length")

    def refit(self, weights, version: int) -> bool:
        raise NotImplementedError("evaluation only")

    def prepare_for_generation(self) -> None:
        pass

    def finish_generation(self) -> None:
        pass


def tool_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    records: list[dict],
    recipe: TinyRecipe,
    with_tools: bool,
) -> dict[str, float]:
    """Greedy held-out accuracy with the calculator offered (with_tools) or not, through the
    rollout loop and the tool environment (calls run in a tool worker process); with the share
    of problems that called it and the share of calls that failed."""
    from nemo_opd.rollouts import run_multi_turn_rollout

    formatter = ChatFormatter(tokenizer, tools=calculator_schemas() if with_tools else None)
    logs = formatter.prompt_logs([r["prompt"] for r in records])
    pool = ToolPool(["calculator"], 1, 5.0, 1024, 1000)
    env = ToolEnvironment(BoxedAnswer(), pool, ["calculator"], parse_hermes, ToolLimits(1000, 2))
    try:
        model.eval()
        result = run_multi_turn_rollout(
            GreedyGeneration(model, tokenizer, recipe.eval_batch_size),
            logs,
            [{"answer": r["answer"]} for r in records],
            formatter,
            {"math": env},
            max_seq_len=model.config.max_position_embeddings,
            max_rollout_turns=recipe.tools.max_turns,
            max_new_tokens=recipe.eval_max_new_tokens,
            greedy=True,
        )
    finally:
        pool.close()
    calls = sum(int(meta.get("tool_calls", 0)) for meta in result.metadata)
    errors = sum(int(meta.get("tool_errors", 0)) for meta in result.metadata)
    return {
        "accuracy": float(result.rewards.mean()),
        "tool_call_rate": sum(int(m.get("tool_calls", 0)) > 0 for m in result.metadata)
        / len(records),
        "tool_error_rate": errors / max(1, calls),
    }
