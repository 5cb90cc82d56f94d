"""DTensor vs Megatron, step by step, from identical weights on identical batches.

The student is the micro tiny student (Qwen3 architecture, tied embeddings, built by
micro_recipe from a few problems and a handful of steps). The rows are tiny-math problems
rendered with the tiny tokenizer's chat template, each followed by its worked solution as the
assistant turn (a fixed stand-in for a rollout, the same bytes for both backends); the teacher
top-k come from the micro teacher's fp32 Hugging Face forward, computed once here and replayed
to both backends.

For each layout, each backend scores a probe batch (log-probs, top-k), trains STEPS optimizer
steps with the mixed KL loss, and exports its weights in Hugging Face naming. The
tensor-parallel layout runs a copy of the student with one more embedding row (vocabulary 321,
which tp=2 does not divide: both engines pad it to 512 inside and export 321 rows). The
per-step loss, forward KL, reverse KL and gradient norm must agree within RTOL; the top-k and
log-probs within ATOL; and the exported weights, loaded into transformers, must give the same
logits within LOGITS_ATOL. The table printed at the end is the one recorded in docs/megatron.md.
Each layout's two ranks are processes of this machine (the processes executor, which computes
as Ray's workers do bit for bit: tests/unit/policy/test_policy_executors.py).
"""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from nemo_opd.config import ClusterConfig, PolicyConfig
from nemo_opd.data.chat import ChatFormatter
from nemo_opd.data.message_log import flatten_message_logs
from nemo_opd.losses import DistillationLossFn, TopkKLParams
from nemo_opd.policy.policy import Policy
from nemo_opd.tiny.assets import ensure_tiny_assets
from nemo_opd.tiny.recipe import micro_recipe

STEPS = 4
ROWS_PER_STEP = 8
K = 8
RTOL = 1e-4  # fp32 on CPU: per-step loss, KLs and gradient norm
ATOL = 2e-5  # log-probs and top-k log-probs before training
LOGITS_ATOL = 1e-4  # logits of the exported weights after STEPS AdamW steps at lr 1e-3
COMPARED = ("loss", "forward_kl", "reverse_kl", "grad_norm")
# The micro models are nearly uniform after their few training steps, so their KL is ~1e-3 and
# its relative error is dominated by fp32 cancellation (both backends agree to ~3e-8 in absolute
# terms). A sharper teacher makes the KL O(1), where a relative tolerance means something.
TEACHER_TEMPERATURE = 0.25

PACKING = {
    "enabled": True,
    "train_mb_tokens": 128,
    "logprob_mb_tokens": 128,
    "sequence_length_round": 8,
}
ODD_VOCAB = 321  # the micro vocabulary (320) plus one row
CASES = {
    # name: (tensor-parallel size, sequence packing, odd vocabulary); 2 workers each (tp=1
    # means dp=2). Both engines pad every vocabulary to a multiple of 128 x tp (vocab_padding.py:
    # 320 -> 384 at tp=1, 320 and 321 -> 512 at tp=2), so the tp=2 layout takes the same
    # padded path with either vocabulary: it runs the one that tp=2 does not divide.
    "tp1_dp2_packed": (1, True, False),
    "tp2_odd_vocab": (2, False, True),
}


@pytest.fixture(scope="module")
def assets():
    return ensure_tiny_assets(micro_recipe())


@pytest.fixture(scope="module")
def odd_student(assets, tmp_path_factory) -> str:
    """The micro student with an extra (random, never used as input) embedding row."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(assets.student, dtype=torch.float32)
    model.resize_token_embeddings(ODD_VOCAB, mean_resizing=False)
    path = tmp_path_factory.mktemp("odd_student")
    model.save_pretrained(path)
    return str(path)


def fixed_batch(assets, rows: int, offset: int) -> dict[str, torch.Tensor]:
    """`rows` problems from the train split, each with its solution as the assistant turn."""
    tokenizer = AutoTokenizer.from_pretrained(assets.tokenizer)
    formatter = ChatFormatter(tokenizer)
    with open(assets.train_file) as handle:
        records = [json.loads(line) for line in handle][offset : offset + rows]
    logs = []
    for record in records:
        answer = tokenizer(record["solution"], add_special_tokens=False)["input_ids"]
        reply = {"role": "assistant", "content": record["solution"]}
        reply["token_ids"] = answer + [tokenizer.eos_token_id]
        logs.append(formatter.prompt_log(record["prompt"]) + [reply])
    return dict(flatten_message_logs(logs, tokenizer.pad_token_id))


def add_teacher_topk(assets, batch: dict) -> dict:
    """The micro teacher's top-K log-probs at TEACHER_TEMPERATURE (fp32 HF forward)."""
    teacher = AutoModelForCausalLM.from_pretrained(assets.teacher, dtype=torch.float32)
    with torch.no_grad():
        logits = teacher(input_ids=batch["input_ids"]).logits.float()
        logp = torch.log_softmax(logits / TEACHER_TEMPERATURE, -1)
    values, indices = logp.topk(K, dim=-1)
    return {**batch, "teacher_topk_logprobs": values, "teacher_topk_indices": indices.int()}


def student_config(assets, student: str, backend: str, tp: int, packing: bool) -> PolicyConfig:
    raw = {
        "model_name": student,
        "tokenizer": {"name": str(assets.tokenizer)},
        "precision": "float32",
        "train_global_batch_size": ROWS_PER_STEP,
        "train_micro_batch_size": 2,
        "logprob_batch_size": 4,
        "max_total_sequence_length": 128,
        "max_grad_norm": 1.0,
        "optimizer": {"lr": 1e-3, "weight_decay": 0.01},
        "scheduler": {"warmup_steps": 1},
        "dtensor_cfg": {"enabled": backend == "dtensor", "tensor_parallel_size": tp},
        "megatron_cfg": {
            "enabled": backend == "megatron",
            "tensor_model_parallel_size": tp,
            "distributed_optimizer": False,
        },
    }
    if packing:
        raw["sequence_packing"] = PACKING
    return PolicyConfig.model_validate(raw)


def run_backend(cfg: PolicyConfig, batch: dict, probe: dict, name: str) -> dict:
    cluster = ClusterConfig(num_nodes=1, gpus_per_node=2, device="cpu", cpus_per_worker=1)
    loss_fn = DistillationLossFn(params=TopkKLParams(kl_type="mixed"), implementation="torch")
    policy = Policy(cfg, cluster, name=name, executor="processes")
    try:
        out = {
            "logprobs": policy.get_logprobs(probe),
            "topk": policy.get_topk_logits(probe, K),
            "metrics": policy.train(batch, loss_fn),
            "weights": policy.full_weights(),
        }
    finally:
        policy.shutdown()
    return out


def exported_logits(student: str, weights: dict, probe: dict) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(student, dtype=torch.float32)
    model.load_state_dict(weights, strict=True)
    with torch.no_grad():
        return model(input_ids=probe["input_ids"]).logits


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


@pytest.mark.parametrize("case", list(CASES))
def test_dtensor_and_megatron_agree(case, assets, odd_student):
    tp, packing, odd = CASES[case]
    student = odd_student if odd else str(assets.student)
    batch = add_teacher_topk(assets, fixed_batch(assets, STEPS * ROWS_PER_STEP, offset=0))
    probe = fixed_batch(assets, 6, offset=200)
    runs = {
        backend: run_backend(
            student_config(assets, student, backend, tp, packing), batch, probe, backend
        )
        for backend in ("dtensor", "megatron")
    }
    dt, mg = runs["dtensor"], runs["megatron"]

    valid = torch.arange(probe["input_ids"].shape[1]) < probe["input_lengths"].unsqueeze(1) - 1
    logprob_err = float((dt["logprobs"] - mg["logprobs"]).abs()[valid].max())
    topk_err = float((dt["topk"][0] - mg["topk"][0]).abs()[valid].max())
    logits_err = float(
        (
            exported_logits(student, dt["weights"], probe)
            - exported_logits(student, mg["weights"], probe)
        )
        .abs()
        .max()
    )

    header = f"{'case':<15}{'step':>5}" + "".join(
        f"{name + ' dtensor':>20}{'megatron':>14}{'rel':>10}" for name in COMPARED
    )
    lines = [header]
    worst = 0.0
    for step in range(STEPS):
        line = f"{case:<15}{step + 1:>5}"
        for name in COMPARED:
            a, b = mg["metrics"][name][step], dt["metrics"][name][step]
            worst = max(worst, rel(a, b))
            line += f"{b:>20.7g}{a:>14.7g}{rel(a, b):>10.1e}"
        lines.append(line)
    lines.append(
        f"{case}: worst rel {worst:.1e}, probe log-prob max abs {logprob_err:.1e}, "
        f"top-k max abs {topk_err:.1e}, exported-weights logits max abs {logits_err:.1e}"
    )
    print("\n" + "\n".join(lines))

    assert len(mg["metrics"]["loss"]) == STEPS
    for name in COMPARED:
        torch.testing.assert_close(
            torch.tensor(mg["metrics"][name]),
            torch.tensor(dt["metrics"][name]),
            rtol=RTOL,
            atol=0.0,
            msg=lambda m, name=name: f"{case} {name}: {m}",
        )
    torch.testing.assert_close(
        torch.tensor(mg["metrics"]["lr"]), torch.tensor(dt["metrics"]["lr"]), rtol=0, atol=0
    )
    assert logprob_err < ATOL and topk_err < ATOL
    same_ids = torch.equal(dt["topk"][1][valid], mg["topk"][1][valid])
    near_tie = (dt["topk"][0][..., 1:] - dt["topk"][0][..., :-1]).abs()[valid].min() < 1e-4
    assert same_ids or near_tie, f"{case}: top-k ids differ"
    assert logits_err < LOGITS_ATOL
