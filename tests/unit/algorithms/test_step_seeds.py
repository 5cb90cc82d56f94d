"""Which seed each generation request of a step gets: a function of (step, prompt, sample,
turn) only, shared by no other request of the run at any batch size. produce_step runs for
real (multi-turn rollouts, stream_chunks parts, flattening) with a seeded sampler in place of
vLLM whose every reply is its request's seed, and an environment that ends the first prompt's
conversations after one turn and asks the others again. (That vLLM samples by the seeds it is
given is tested in tests/unit/generation.)"""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from nemo_opd.algorithms.rollout_pipeline import PlannedStep, StepPipeline
from nemo_opd.algorithms.step_rollouts import produce_step, step_seed
from nemo_opd.config import load_config
from nemo_opd.data.chat import ChatFormatter
from nemo_opd.environments.base import EnvironmentStep
from nemo_opd.generation.interface import GenerationOutput
from nemo_opd.rollouts.multi_turn import request_seed

ROOT = Path(__file__).resolve().parents[3]
PROMPTS = 4
COPIES = 2
TURNS = 3
STEP = 3


class SeedEcho:
    """A seeded sampler: each request's reply is its seed, as text (so what it samples
    depends on the request's seed alone), cut at the request's budget."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompts, *, max_new_tokens=None, greedy=False, seed=None, temperature=None):
        if not isinstance(seed, list):
            seed = [request_seed(seed, i, 0) for i in range(len(prompts))]
        out = GenerationOutput([], [], [])
        for one_seed, budget in zip(seed, max_new_tokens, strict=True):
            ids = self.tokenizer(f"{one_seed}<|im_end|>", add_special_tokens=False)
            ids = ids["input_ids"]
            out.token_ids.append(ids[:budget])
            out.logprobs.append([-1.0] * len(ids[:budget]))
            out.finish_reasons.append("stop" if len(ids) <= budget else "length")
        return out

    def prepare_for_generation(self):
        pass

    def finish_generation(self):
        pass


class DoneOnceMarked:
    """Ends a conversation whose metadata says "done_at_once"; asks the others again."""

    def step(self, logs, metadata):
        done = [bool(m.get("done_at_once")) for m in metadata]
        retry = {"role": "user", "content": "Try again."}
        return EnvironmentStep(
            rewards=[float(d) for d in done],
            done=done,
            next_messages=[None if d else retry for d in done],
            metadata=[dict(m) for m in metadata],
        )


def step_state(tokenizer, stream_chunks: int) -> SimpleNamespace:
    """A run's state with what producing an on-policy step of the no-teacher GRPO config
    reads."""
    cfg = load_config(
        ROOT / "examples" / "configs" / "grpo_tiny.yaml",
        [
            f"distillation.num_prompts_per_step={PROMPTS}",
            f"distillation.num_generations_per_prompt={COPIES}",
            f"distillation.max_rollout_turns={TURNS}",
            f"distillation.stream_chunks={stream_chunks}",
            f"policy.train_global_batch_size={PROMPTS * COPIES}",
            f"policy.train_micro_batch_size={PROMPTS * COPIES}",
            "policy.generation.max_new_tokens=24",
        ],
    )
    return SimpleNamespace(
        cfg=cfg,
        saved_rollouts={},
        generation_version=STEP - 1,  # the engine holds the step's weights: no refit
        generation=SeedEcho(tokenizer),
        teacher_sampler=None,
        teacher=None,
        formatter=ChatFormatter(tokenizer),
        environments={"math": DoneOnceMarked()},
    )


def seeds_by_row(tokenizer, stream_chunks: int) -> tuple[list[list[int]], int]:
    """The seeds of each row's turns in a step, and the step's seed."""
    state = step_state(tokenizer, stream_chunks)
    samples = [
        {
            "message_log": state.formatter.prompt_log(f"What is {p} + {p}?"),
            "metadata": {"answer": str(2 * p), "done_at_once": p == 0},
        }
        for p in range(PROMPTS)
    ]
    plan = PlannedStep(STEP, samples, False, {}, {}, on_policy=True, version=STEP - 1)
    pipeline = StepPipeline(iter(()), produce_step, 0, start_version=STEP - 1)
    produced = produce_step(state, pipeline, plan)
    pipeline.stop()
    seeds = [
        [int(m["content"]) for m in log if m["role"] == "assistant"]
        for log in produced.rollout.message_logs
    ]
    return seeds, step_seed(state.cfg, STEP)


@pytest.mark.parametrize("stream_chunks", [2, PROMPTS])
def test_request_seeds_depend_only_on_step_prompt_sample_and_turn(chat_tokenizer, stream_chunks):
    whole, base = seeds_by_row(chat_tokenizer, 1)
    assert [len(turns) for turns in whole] == [1] * COPIES + [TURNS] * (PROMPTS - 1) * COPIES
    # Streamed in parts, every row's turns sample with the seeds they have in the whole batch.
    assert seeds_by_row(chat_tokenizer, stream_chunks)[0] == whole
    # Row r's turn t samples with request_seed(step seed, r, t).
    assert whole == [
        [request_seed(base, row, turn) for turn in range(len(turns))]
        for row, turns in enumerate(whole)
    ]
    # No request reuses another's seed (a later turn of its row, or of another row), not even
    # in the low 32 bits, all that a CPU generator reads of a seed.
    every = [seed for turns in whole for seed in turns]
    assert len({seed % 2**32 for seed in every}) == len(every)


def test_no_two_requests_of_a_run_share_a_seed_at_ten_thousand_rows():
    """NeMo-RL's math recipe makes 512 x 16 = 8,192 rows a step: at 10,000 rows a step (625
    prompts x 16 samples), 3 turns each, steps 0 to 20 and the validation rows, every request
    has a seed of its own, and in each step even its low 32 bits (what a CPU generator reads)
    are its own."""
    rows, turns, steps = 10_000, 3, range(21)
    cfg = load_config(ROOT / "examples" / "configs" / "grpo_tiny.yaml")
    seen = set()
    for step in steps:
        base = step_seed(cfg, step)
        seeds = {request_seed(base, row, turn) for row in range(rows) for turn in range(turns)}
        assert len({seed % 2**32 for seed in seeds}) == rows * turns, f"step {step}"
        seen |= seeds
    assert len(seen) == len(steps) * rows * turns
    assert all(0 <= seed < 2**63 for seed in seen)  # an int64 for every generator


def test_step_seeds_are_the_same_in_every_process():
    """A hash of (seed, step), not Python's hash(): another process, with another string hash
    seed, derives the same step seeds (a resumed run samples as an uninterrupted one)."""
    cfg = load_config(ROOT / "examples" / "configs" / "grpo_tiny.yaml")
    here = [step_seed(cfg, step) for step in range(5)]
    code = (
        "from nemo_opd.config import load_config; "
        "from nemo_opd.algorithms.step_rollouts import step_seed; "
        f"cfg = load_config({str(ROOT / 'examples' / 'configs' / 'grpo_tiny.yaml')!r}); "
        "print([step_seed(cfg, step) for step in range(5)])"
    )
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        shown = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
        )
        assert shown.stdout.strip() == str(here)
