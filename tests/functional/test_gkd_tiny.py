"""The GKD family in the loop, on the tiny task: off-policy data (the dataset's responses,
data.response_key) mixed by lmbda, the supervised baseline, and self-distillation with a
privileged-context teacher. The runs share this process's imports; each runs in this process
(the local executor) but the one whose layout needs two ranks, which runs them as processes of
this machine (cluster.executor=processes), and the served teacher's, which attaches to the
module's Ray.

- lmbda 0.5: each step is on- or off-policy as the documented rule says (seed 42: off, on, on,
  off); off-policy steps train on the reference solutions (all correct: reward 1), skip the
  refit and the sampler check; on-policy steps sample as always.
- lmbda 0: its first step is the mixed run's first step exactly (both off-policy, from the
  same weights), and its data at step 4 (another off-policy step of the mixed run) is the same.
- seq_kd: the off-policy responses are the teacher's samples, from a vLLM engine holding it
  (no dataset responses at all); the teacher answers far better than the student.
- objective.loss sft: no teacher starts; the NLL of the solutions falls.
- self-distillation (the teacher is the student's own starting model): without context its
  first-step divergence is zero (the same weights see the same tokens); with the reference
  solution in the teacher's prompt (teacher.prompt_template) it is not, on the same rollouts.
- several teachers routed by data source: each prompt's rollouts are scored by its teacher
  (the per-teacher divergence at step 0 shows which), with metrics per teacher.
"""

import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from run_metrics import read_metrics
from short_runs import LOCKSTEP, short_run_args

from nemo_opd.algorithms.data_mix import is_on_policy_step
from nemo_opd.cli import main
from nemo_opd.config import load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "configs"
STEPS = 4
DATA_METRICS = ("train/num_tokens", "train/reward", "rollout/mean_generated_tokens")


def run_loop(run_dir: Path, config: str, *extra: str) -> dict[int, dict]:
    status = main(short_run_args(CONFIGS / config, run_dir, STEPS, *LOCKSTEP, *extra))
    assert status == 0
    return read_metrics(run_dir)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    return run_loop(
        tmp_path_factory.mktemp("mixed"), "distillation_tiny.yaml", "distillation.lmbda=0.5"
    )


def test_each_step_is_on_or_off_policy_by_the_rule(mixed):
    cfg = load_config(CONFIGS / "distillation_tiny.yaml", ["distillation.lmbda=0.5"])
    kinds = [is_on_policy_step(cfg, step) for step in range(1, STEPS + 1)]
    assert kinds == [False, True, True, False]  # seed 42: both kinds, off first
    for step, on in enumerate(kinds, start=1):
        metrics = mixed[step]
        assert metrics["rollout/on_policy"] == float(on)
        assert ("generation/logprob_mismatch" in metrics) == on
        assert ("timing/train/refit" in metrics) == on
        if not on:  # the reference solutions: correct, and ended by EOS
            assert metrics["train/reward"] == 1.0
            assert metrics["rollout/natural_termination_rate"] == 1.0
        # 8 prompts: 2 samples each on-policy, each response once off-policy
        assert metrics["rollout/samples"] == (16.0 if on else 8.0)


def test_lmbda_0_is_the_mixed_runs_off_policy_steps(mixed, tmp_path):
    off = run_loop(tmp_path, "distillation_tiny.yaml", "distillation.lmbda=0")
    assert all(off[step]["rollout/on_policy"] == 0.0 for step in range(1, STEPS + 1))
    for key in ("train/loss", "train/forward_kl", "train/reverse_kl", *DATA_METRICS):
        assert off[1][key] == pytest.approx(mixed[1][key], rel=1e-6, abs=1e-9), key
    for key in DATA_METRICS:  # step 4: the same prompts and responses, other weights
        assert off[4][key] == mixed[4][key], key


def test_sft_trains_on_the_responses_without_a_teacher(tmp_path, capsys):
    sft = run_loop(tmp_path, "sft_tiny.yaml")
    out = capsys.readouterr().out
    assert "objective: supervised NLL of the dataset's responses (no teacher)" in out
    assert not any(key.startswith("timing/startup/teacher") for key in sft[1])
    assert all(sft[step]["rollout/on_policy"] == 0.0 for step in range(1, STEPS + 1))
    assert "train/forward_kl" not in sft[1] and sft[1]["train/reward"] == 1.0
    assert sft[STEPS]["train/loss"] < 0.8 * sft[1]["train/loss"]


SELF_TEACHER = ("teacher.model_name=tiny:student", "distillation.max_num_steps=1")
"""The student's own start as its teacher, for one step."""


@pytest.fixture(scope="module")
def plain_self_teacher(tmp_path_factory):
    """The first step's metrics with the student's own start as the teacher, as is: the
    reference of the privileged-context and the other-template self-teachers."""
    return run_loop(tmp_path_factory.mktemp("plain"), "distillation_tiny.yaml", *SELF_TEACHER)[1]


def test_self_distillation_with_privileged_context(plain_self_teacher, tmp_path):
    template = "teacher.prompt_template='{prompt} A correct solution: {response}'"
    privileged = run_loop(tmp_path, "distillation_tiny.yaml", *SELF_TEACHER, template)[1]
    plain = plain_self_teacher
    assert plain["train/reverse_kl"] < 1e-5 and plain["train/forward_kl"] < 1e-5
    assert privileged["train/reverse_kl"] > 0.05 and privileged["train/forward_kl"] > 0.05
    # The same rollouts (same weights, seed and prompts), graded by a better-informed teacher.
    for key in ("train/reward", "train/num_tokens"):
        assert privileged[key] == plain[key], key


def test_seq_kd_trains_on_the_teachers_samples(mixed, tmp_path):
    seq_kd = run_loop(
        tmp_path,
        "distillation_tiny.yaml",
        "distillation.lmbda=0",
        "distillation.seq_kd=true",
        "data.response_key=null",
        "distillation.max_num_steps=2",
    )
    assert any(key.startswith("timing/startup/teacher_vllm.0/") for key in seq_kd[1])
    for step in (1, 2):
        assert seq_kd[step]["rollout/on_policy"] == 0.0
        assert seq_kd[step]["rollout/teacher_sampled"] == 1.0
        assert "generation/logprob_mismatch" not in seq_kd[step]
    # Sampled (not the dataset's solutions: their reward is 1), by a better model than the
    # student, whose own samples at step 2 of the mixed run (same settings) scored lower.
    assert mixed[2]["train/reward"] < seq_kd[1]["train/reward"] < 1.0


def test_routed_teachers_score_each_prompt_with_its_own(tmp_path):
    """Multiplication goes to the tiny teacher, addition and subtraction to the student's own
    start (distillation_tiny_routed.yaml): at step 0 the student diverges from the second by
    ~0 on exactly its prompts' rollouts, from the first by far more."""
    routed = run_loop(
        tmp_path,
        "distillation_tiny_routed.yaml",
        "distillation.max_num_steps=2",
        "distillation.val_at_start=true",
        "distillation.max_val_samples=48",
        "distillation.val_batch_size=48",
    )
    start = routed[0]
    assert abs(start["validation/teacher/start/forward_kl"]) < 1e-5
    assert start["validation/teacher/start/top1_agreement"] == 1.0
    assert start["validation/teacher/arithmetic/forward_kl"] > 0.05
    # The overall divergence is the token-weighted mean of the two teachers' parts.
    parts = [start[f"validation/teacher/{t}/forward_kl"] for t in ("start", "arithmetic")]
    assert min(parts) < start["validation/forward_kl"] < max(parts)
    for teacher in ("arithmetic", "start"):  # start-up times logged with the first metrics
        assert any(key.startswith(f"timing/startup/teacher.{teacher}.0/") for key in start)
    for metrics in (routed[1], routed[2]):  # every rollout of the step is some teacher's
        samples = [metrics[f"teacher/{t}/samples"] for t in ("start", "arithmetic")]
        assert sum(samples) == 16 and min(samples) > 0


def test_a_teacher_with_its_own_chat_template_reads_its_own_rendering(
    plain_self_teacher, tmp_path, capsys
):
    """The student's own start as the teacher, under another chat template (a "Q: " before
    every user message): the teacher reads the student's text in its own tokens and template
    (the cross-tokenizer path), so unlike the plain self-teacher its divergence is not 0, on
    the same rollouts; every teacher id maps to a student id (one vocabulary)."""
    from transformers import AutoTokenizer

    from nemo_opd.tiny import resolve_pretrained

    template = AutoTokenizer.from_pretrained(resolve_pretrained("tiny:tokenizer")).chat_template
    other = template.replace("message['role'] + '\\n' + message['content']", (
        "message['role'] + '\\nQ: ' + message['content']"
    ))  # fmt: skip
    assert other != template
    (tmp_path / "template.jinja").write_text(other)
    crossed = run_loop(
        tmp_path / "crossed",
        "distillation_tiny.yaml",
        *SELF_TEACHER,
        f"teacher.tokenizer.chat_template={tmp_path / 'template.jinja'}",
    )[1]
    assert "its chat template writes a conversation differently" in capsys.readouterr().out
    plain = plain_self_teacher
    assert plain["train/forward_kl"] < 1e-5 < crossed["train/forward_kl"]
    assert crossed["teacher/xtok_mapped_mass"] == pytest.approx(1.0, abs=1e-4)
    for key in ("train/reward", "train/num_tokens"):
        assert crossed[key] == plain[key], key


def test_routed_teachers_one_with_another_tokenizer_on_megatron_tp2_packed(tmp_path):
    """distillation_tiny_routed.yaml with its multiplication teacher swapped for the tiny
    teacher of another tokenizer and chat template (tiny:xtok_teacher), run by megatron-core at
    tensor parallel 2 with packed rows, beside the same-tokenizer route on DTensor: both routes
    score their rollouts, the crossed one through its own tokens (every id it names maps)."""
    arithmetic = "teachers.arithmetic"
    routed = run_loop(
        tmp_path,
        "distillation_tiny_routed.yaml",
        "distillation.max_num_steps=2",
        "cluster.gpus_per_node=2",
        "cluster.cpus_per_worker=1",
        "cluster.executor=processes",  # two ranks, no Ray
        f"{arithmetic}.model_name=tiny:xtok_teacher",
        f"{arithmetic}.tokenizer.name=tiny:xtok_tokenizer",
        f"{arithmetic}.dtensor_cfg.enabled=false",
        f"{arithmetic}.megatron_cfg.enabled=true",
        f"{arithmetic}.megatron_cfg.tensor_model_parallel_size=2",
        f"{arithmetic}.sequence_packing.enabled=true",
        f"{arithmetic}.sequence_packing.logprob_mb_tokens=512",
    )
    for step in (1, 2):
        samples = [routed[step][f"teacher/{t}/samples"] for t in ("start", "arithmetic")]
        assert sum(samples) == 16 and min(samples) > 0
        assert routed[step]["teacher/xtok_mapped_mass"] == pytest.approx(1.0, abs=1e-4)
        assert 0.9 < routed[step]["teacher/xtok_graded_share"] <= 1.0
        assert 0.0 < routed[step]["train/forward_kl"] < 5.0


def _tiny_model_with(tokenizer, config, path: Path) -> str:
    """A tiny random model of `config`'s architecture with a real tokenizer's vocabulary,
    saved with that tokenizer (float32, tied embeddings)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def real_vocabulary_models(tmp_path_factory) -> tuple[str, ...]:
    """Tiny random models with real vocabularies: a Qwen3-architecture student at Qwen3's
    151,936 ids with Qwen3's tokenizer and template, a Llama-architecture teacher at Llama 3's
    128,256 with Llama 3's; the overrides that name them."""
    if not os.environ.get("CI"):  # in CI the dev group installs them: a missing one fails
        pytest.importorskip("dashscope", reason="the vocabularies' packages: uv sync --group dev")
    from transformers import LlamaConfig, Qwen3Config

    sys.path.insert(0, str(ROOT / "tests"))
    import real_tokenizers

    # head_dim 32: vLLM's CPU attention has no kernel for 16
    shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
                 tie_word_embeddings=True)  # fmt: skip
    qwen, llama = real_tokenizers.load("qwen3"), real_tokenizers.load("llama3")
    tmp_path = tmp_path_factory.mktemp("real_vocabularies")
    student = _tiny_model_with(qwen, Qwen3Config(vocab_size=151936, **shape), tmp_path / "s")
    teacher_config = LlamaConfig(
        vocab_size=128256, bos_token_id=128000, eos_token_id=128009, **shape
    )
    teacher = _tiny_model_with(llama, teacher_config, tmp_path / "t")
    return (
        f"policy.model_name={student}",
        f"policy.tokenizer.name={student}",
        f"teacher.model_name={teacher}",
        f"teacher.tokenizer.name={teacher}",
    )


def assert_real_vocabulary_steps(metrics: dict[int, dict]) -> None:
    """The teacher read the student's rollouts in its own tokens and its top-k reached the
    student's ids, on both steps."""
    for step in (1, 2):
        assert 0.0 < metrics[step]["teacher/xtok_graded_share"] <= 1.0
        assert 0.5 < metrics[step]["teacher/xtok_mapped_mass"] <= 1.0 + 1e-4
        assert metrics[step]["teacher/xtok_unrendered_rows"] == 0.0
        assert math.isfinite(metrics[step]["train/loss"])


def test_real_vocabularies_qwen3_student_llama3_teacher(real_vocabulary_models, tmp_path):
    """The loop end to end with real vocabularies, the teacher in process (its workers render
    and map the student's rollouts)."""
    metrics = run_loop(
        tmp_path / "run", "distillation_tiny.yaml", "distillation.max_num_steps=2",
        *real_vocabulary_models,
    )  # fmt: skip
    assert_real_vocabulary_steps(metrics)


@pytest.mark.slow  # a vLLM server of its own: `pytest -m slow`
@pytest.mark.usefixtures("ray_session")  # auto runs a served teacher's workers on Ray
def test_real_vocabularies_with_the_teacher_served(real_vocabulary_models, tmp_path):
    """The same with the teacher served by vLLM's OpenAI-compatible server."""
    models = real_vocabulary_models
    with _served_teacher(CONFIGS / "distillation_tiny_served_teacher.yaml", models) as url:
        metrics = run_loop(
            tmp_path / "served",
            "distillation_tiny_served_teacher.yaml",
            "distillation.max_num_steps=2",
            f"teacher.server.base_url={url}",
            *models,
        )
    assert_real_vocabulary_steps(metrics)


@contextlib.contextmanager
def _served_teacher(config: Path, overrides):
    """`python -m nemo_opd.teacher_server` for `config` with `overrides` on a free loopback
    port, in its own process group; yields its base URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "nemo_opd.teacher_server", "--config", str(config)]
    process = subprocess.Popen(
        [*command, "--port", str(port), *overrides],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        if not any(line.startswith("teacher server ready") for line in process.stdout):
            pytest.fail(f"the teacher server did not start (status {process.poll()})")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(60)


def test_full_vocabulary_divergence_is_the_top_k_one_at_k_equal_v(tmp_path):
    """loss_fn.support full (the teacher's hidden states and LM head) and the top-k divergence
    with every id in the top-k (k = V = 481, the tail bucket empty) grade the same first
    step's rollouts (same seed, same weights) with the same loss."""
    one_step = ("distillation.max_num_steps=1",)
    full = run_loop(tmp_path / "full", "distillation_tiny_full_vocab.yaml", *one_step)[1]
    topk = run_loop(
        tmp_path / "topk",
        "distillation_tiny_100_lockstep.yaml",
        *one_step,
        "distillation.topk_logits_k=481",
    )[1]
    assert full["train/reward"] == topk["train/reward"]  # the same rollouts
    assert "timing/train/teacher_hidden" in full and "timing/train/teacher_topk" not in full
    assert full["train/teacher_tail_mass"] == 0.0 and full["train/student_topk_mass"] == 1.0
    for key in ("train/loss", "train/forward_kl", "train/reverse_kl"):
        assert full[key] == pytest.approx(topk[key], rel=1e-4), key
