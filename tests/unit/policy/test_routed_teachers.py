"""Several teachers routed by row: each row's top-k and log-probs are its own teacher's, in one
process and under tensor parallelism (two teachers that differ, sharing the bundles as in the
loop)."""

import pytest
import torch
from tiny_policies import executor_for, make_batch, policy_config, start_policy
from torch_threads import threads_kept

from nemo_opd.data.batching import TensorBatch
from nemo_opd.distributed.cluster import WorkerResources, build_placement_group
from nemo_opd.scoring.base import Rollouts, TeacherNeed
from nemo_opd.teachers.in_process import InProcessTeacher
from nemo_opd.teachers.routed import RoutedTeachers, route_rows

RAY_CPUS = 2
K = 4
ROUTES = ["b", "a", "a", "b", "b", "a", "b"]  # ragged rows of make_batch, mixed


def frozen(model_dir, workers, tp, placement, name):
    cfg = policy_config(
        model_dir, optimizer=None, scheduler=None, dtensor_cfg__tensor_parallel_size=tp
    )
    return start_policy(
        cfg, workers, optimizer=False, name=name, placement=placement, share=0.5, wait=False
    )


def start_teachers(model_dirs, workers, tp):
    """Teachers "a" and "b" sharing the bundles of one placement group as in the loop (one
    worker each: both in this process, which has no bundles), and what releases the group."""
    placement = None
    if executor_for(workers) == "ray":
        placement = build_placement_group(workers, WorkerResources("cpu", 1))
    teachers = {
        "a": frozen(model_dirs["tied"], workers, tp, placement, f"teacher_a_tp{tp}"),
        "b": frozen(model_dirs["untied"], workers, tp, placement, f"teacher_b_tp{tp}"),
    }
    for teacher in teachers.values():
        teacher.wait_until_ready()
    return teachers, lambda: release(placement)


def release(placement) -> None:
    if placement is not None:
        import ray

        ray.util.remove_placement_group(placement)


@pytest.fixture(scope="module")
def references(model_dirs):
    """Each teacher alone on the whole batch, in this process: {name: (values, ids,
    logprobs)}."""
    with threads_kept():
        teachers, release_group = start_teachers(model_dirs, 1, 1)
        batch = make_batch(len(ROUTES), teacher=False)
        try:
            return {
                name: (*teacher.get_topk_logits(batch, K), teacher.get_logprobs(batch))
                for name, teacher in teachers.items()
            }
        finally:
            for teacher in teachers.values():
                teacher.shutdown()
            release_group()


def routed_rollouts(routes):
    """make_batch rows, each routed by its metadata's "teacher"."""
    batch = TensorBatch(make_batch(len(routes), teacher=False))
    return Rollouts(batch, [[] for _ in routes], [{"teacher": name} for name in routes])


def test_route_rows_keeps_batch_order():
    groups = route_rows(ROUTES)
    assert list(groups) == ["b", "a"]
    assert groups["a"].tolist() == [1, 2, 5] and groups["b"].tolist() == [0, 3, 4, 6]


@pytest.mark.parametrize(("workers", "tp"), [(1, 1), (2, 2)], ids=["one_process", "tp2"])
def test_each_row_is_scored_by_its_routed_teacher(model_dirs, ray_session, references, workers, tp):
    a, b = references["a"], references["b"]
    assert not torch.allclose(a[0], b[0], atol=1e-3)  # the teachers differ: routing shows
    teachers, release = start_teachers(model_dirs, workers, tp)
    routed = RoutedTeachers({name: InProcessTeacher(p, name) for name, p in teachers.items()})
    rollouts = routed_rollouts(ROUTES)
    try:
        topk = routed.score(rollouts, TeacherNeed(topk=K))
        values, ids = topk.topk_logprobs, topk.topk_indices
        assert topk.logprobs is None  # only what was asked for
        logprobs = routed.score(rollouts, TeacherNeed(sampled=True)).logprobs
        assert sorted(routed.workers()) == ["a", "b"]
        assert {n: r.tolist() for n, r in routed.groups(rollouts.metadata).items()} == {
            "b": [0, 3, 4, 6],
            "a": [1, 2, 5],
        }
    finally:
        routed.shutdown()
        release()
    for row, name in enumerate(ROUTES):
        ref_values, ref_ids, ref_logprobs = references[name]
        torch.testing.assert_close(values[row], ref_values[row], atol=2e-5, rtol=1e-5)
        assert torch.equal(ids[row], ref_ids[row])
        torch.testing.assert_close(logprobs[row], ref_logprobs[row], atol=2e-5, rtol=1e-5)
    assert values.shape == (len(ROUTES), *a[0].shape[1:]) and ids.dtype == torch.int32


def test_a_row_routed_to_no_teacher_is_an_error():
    routed = RoutedTeachers({"a": object()})
    with pytest.raises(ValueError, match=r"rows routed to \['c'\], which are not among \['a'\]"):
        routed.score(routed_rollouts(["a", "c"]), TeacherNeed(sampled=True))
    rollouts = routed_rollouts(["a", "a"])
    rollouts.metadata[1] = {}
    with pytest.raises(ValueError, match=r"rows routed to \['None'\]"):
        routed.score(rollouts, TeacherNeed(sampled=True))
