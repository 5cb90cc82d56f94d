"""The self-teacher's weights in the student's engine (teacher.source student, ema, lagged): the
EMA against a float64 reference, the lagged snapshot's refreshes, scoring with them equal to a
separate engine loaded with those weights, no gradient through the teacher's pass, and the
checkpoint's copy restored bit for bit (one gloo process, the DTensor engine, no Ray)."""

import json

import pytest
import torch
from tiny_policies import make_batch, policy_config

from nemo_opd.data.batching import TensorBatch
from nemo_opd.distributed.parallel_dims import ParallelDims
from nemo_opd.distributed.process_group import init_local_process_group
from nemo_opd.losses import DistillationLossFn, TopkKLParams
from nemo_opd.losses.full_vocab_loss import FullVocabDistillationLossFn
from nemo_opd.policy.engines.dtensor import DTensorEngine
from nemo_opd.policy.engines.self_teacher_weights import (
    TEACHER_DIR,
    TEACHER_STATE_FILE,
    hold_self_teacher,
    score_as_teacher,
)

LOSS = DistillationLossFn(params=TopkKLParams(kl_type="reverse"), implementation="torch")
NEED = {"topk": 5, "temperature": 0.8, "logprobs": True, "hidden": True}


@pytest.fixture(scope="module")
def world1():
    """The process's one-rank gloo group (shared with every other model of the test process, as
    in a run in one process), and its meshes."""
    init_local_process_group("cpu")
    dims = ParallelDims(world_size=1, device_type="cpu")
    dims.build_mesh()
    return dims


def student(world1, model_dir, source=None, decay=0.0, refresh=1) -> DTensorEngine:
    """A training engine on `model_dir` (lr high enough that a step moves every weight),
    holding the self-teacher of `source` when given."""
    cfg = policy_config(model_dir, optimizer={"lr": 3e-2, "weight_decay": 0.0})
    engine = DTensorEngine(cfg, world1, torch.device("cpu"), total_steps=10)
    if source is not None:
        hold_self_teacher(engine, source, decay, refresh)
    return engine


def train(engine, seed: int) -> None:
    """One loop step's training call: 8 rows, two optimizer steps of 4."""
    engine.train(TensorBatch(make_batch(8, seed=seed)), LOSS, global_batch_size=4)


def weights(engine) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in engine.model.named_parameters()}


def teacher_weights(engine) -> dict[str, torch.Tensor]:
    """A copy of the self-teacher's weights by parameter name."""
    names = [name for name, p in engine.model.named_parameters() if p.requires_grad]
    return {n: c.clone() for n, c in zip(names, engine.self_teacher.copies, strict=True)}


def test_ema_follows_a_float64_reference(world1, model_dirs):
    engine = student(world1, model_dirs["untied"], "ema", decay=0.7)
    reference = {name: w.double() for name, w in weights(engine).items()}
    for seed in range(3):
        train(engine, seed)
        for name, live in weights(engine).items():
            reference[name] = 0.7 * reference[name] + 0.3 * live.double()
    assert engine.self_teacher.updates == 3
    held = teacher_weights(engine)
    assert held.keys() == reference.keys()
    for name, want in reference.items():
        torch.testing.assert_close(held[name].double(), want, rtol=1e-6, atol=1e-7)
    live = weights(engine)
    assert any(not torch.equal(held[n], live[n]) for n in held)  # an average, not the weights


def test_lagged_snapshot_is_refreshed_every_n_steps(world1, model_dirs):
    engine = student(world1, model_dirs["untied"], "lagged", refresh=2)
    initial = weights(engine)
    snapshots = []
    for seed in range(5):
        train(engine, seed)
        snapshots.append((weights(engine), teacher_weights(engine)))

    def same(a, b):
        return all(torch.equal(a[n], b[n]) for n in b)

    assert same(snapshots[0][1], initial)  # step 1: still the initial weights
    assert same(snapshots[1][1], snapshots[1][0])  # step 2: refreshed to step 2's weights
    assert same(snapshots[2][1], snapshots[1][0]) and not same(snapshots[2][1], snapshots[2][0])
    assert same(snapshots[3][1], snapshots[3][0])  # step 4
    assert same(snapshots[4][1], snapshots[3][0])


@pytest.mark.parametrize("source", ["student", "ema", "lagged"])
def test_scores_equal_an_engine_loaded_with_the_teachers_weights(
    source, world1, model_dirs, tmp_path
):
    """Top-k, sampled-token log-probs and hidden states of the self-teacher's pass are a frozen
    engine's started from those weights (the checkpoint's teacher folder for ema and lagged, the
    live weights for the student), and the held LM head is that model's."""
    engine = student(world1, model_dirs["tied"], source, decay=0.5, refresh=2)
    for seed in range(3):
        train(engine, seed)
    batch = TensorBatch(make_batch(5, teacher=False, seed=9))
    scores = score_as_teacher(engine, batch, **NEED)
    engine.save(str(tmp_path / "policy"))
    folder = tmp_path / "policy" / (TEACHER_DIR if source != "student" else "")
    frozen = DTensorEngine(
        policy_config(str(folder)), world1, torch.device("cpu"), with_optimizer=False
    )
    want = frozen.score(batch, **NEED)
    assert scores.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(scores[name], value), name
    torch.testing.assert_close(engine.teacher_head.weight, frozen.output_weight(), rtol=0, atol=0)
    if source == "student":  # the live weights: no copy of them held, none saved
        assert engine.self_teacher.copies == []
        assert not (tmp_path / "policy" / TEACHER_DIR).exists()
    if source != "student":  # and it is not the live student
        live = engine.score(batch, **NEED)
        assert not torch.equal(scores["topk_logprobs"], live["topk_logprobs"])


def test_the_teachers_pass_leaves_the_student_and_its_gradients_alone(world1, model_dirs):
    """Scoring swaps the EMA in and back exactly, makes no gradient, and the LM head it leaves
    for the full-vocabulary loss is a frozen copy: training from the teacher's hidden states
    moves the student's head, not the teacher's."""
    engine = student(world1, model_dirs["untied"], "ema", decay=0.5)
    train(engine, 0)
    before = weights(engine)
    grads = {name: p.grad.clone() for name, p in engine.model.named_parameters()}
    batch = make_batch(8, teacher=False, seed=3)
    scores = score_as_teacher(engine, TensorBatch(batch), **NEED)
    assert all(not v.requires_grad and v.grad_fn is None for v in scores.values())
    for name, param in engine.model.named_parameters():
        assert torch.equal(param, before[name]) and torch.equal(param.grad, grads[name]), name
    head = engine.teacher_head.weight
    assert not head.requires_grad
    assert head.data_ptr() != engine.output_weight().data_ptr()
    frozen_head = head.clone()

    batch["teacher_hidden"] = scores["hidden_states"]
    loss = FullVocabDistillationLossFn(params=TopkKLParams(kl_type="reverse"), support="full")
    engine.train(TensorBatch(batch), loss, global_batch_size=4)
    assert torch.equal(engine.teacher_head.weight, frozen_head)
    assert not torch.equal(engine.output_weight(), before["lm_head.weight"])


@pytest.mark.parametrize("source", ["ema", "lagged"])
def test_a_checkpoint_restores_the_teacher_bit_for_bit(source, world1, model_dirs, tmp_path):
    saved = student(world1, model_dirs["untied"], source, decay=0.6, refresh=2)
    for seed in range(3):
        train(saved, seed)
    saved.save(str(tmp_path / "ckpt"))
    state = json.loads((tmp_path / "ckpt" / TEACHER_DIR / TEACHER_STATE_FILE).read_text())
    assert state == {"source": source, "updates": 3}

    resumed = student(world1, model_dirs["untied"], source, decay=0.6, refresh=2)
    resumed.load(str(tmp_path / "ckpt"))
    assert resumed.self_teacher.updates == 3
    for engine in (saved, resumed):  # step 4 refreshes the snapshot; the EMA averages it in
        train(engine, 3)
    for name, tensor in teacher_weights(saved).items():
        assert torch.equal(teacher_weights(resumed)[name], tensor), name
    for name, tensor in weights(saved).items():
        assert torch.equal(weights(resumed)[name], tensor), name

    other = "lagged" if source == "ema" else "ema"
    wrong = student(world1, model_dirs["untied"], other)
    with pytest.raises(ValueError, match=f"holds a teacher of source {source}.*source is {other}"):
        wrong.load(str(tmp_path / "ckpt"))


def test_a_lora_students_average_is_its_adapters(world1, model_dirs, tmp_path):
    """With LoRA only the adapters train: the average holds them alone (the frozen base is
    shared), the checkpoint's teacher folder is a peft adapter, and an engine with those
    adapters scores as the self-teacher does."""
    lora = {"lora__enabled": True, "lora__rank": 2, "lora__target_modules": ["q_proj", "v_proj"]}
    cfg = policy_config(model_dirs["untied"], optimizer={"lr": 3e-2, "weight_decay": 0.0}, **lora)
    engine = DTensorEngine(cfg, world1, torch.device("cpu"), total_steps=10)
    hold_self_teacher(engine, "ema", 0.5, 1)
    adapters = [name for name, p in engine.model.named_parameters() if p.requires_grad]
    assert adapters and all("lora" in name for name in adapters)
    assert len(engine.self_teacher.copies) == len(adapters)
    for seed in range(2):
        train(engine, seed)
    batch = TensorBatch(make_batch(5, teacher=False, seed=9))
    scores = score_as_teacher(engine, batch, **NEED)
    engine.save(str(tmp_path / "policy"))
    assert (tmp_path / "policy" / TEACHER_DIR / "adapter_model.safetensors").is_file()

    frozen = DTensorEngine(cfg, world1, torch.device("cpu"), with_optimizer=False)
    frozen.load_weights(tmp_path / "policy" / TEACHER_DIR)
    want = frozen.score(batch, **NEED)
    for name, value in want.items():
        assert torch.equal(scores[name], value), name
