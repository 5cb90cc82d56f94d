"""Student and teacher colocated on one placement group of 2 CPU bundles (Ray has 2 CPUs):
each takes half of every bundle, and both work."""

import torch
from tiny_policies import cpu_cluster, make_batch, policy_config

from nemo_opd.distributed.cluster import WorkerResources, build_placement_group
from nemo_opd.losses import DistillationLossFn
from nemo_opd.policy.policy import Policy

RAY_CPUS, RAY_CPUS_EXACT = 2, True  # the two groups hold every CPU: none is left free


def test_student_and_teacher_share_bundles(model_dirs, ray_session):
    import ray

    placement = build_placement_group(2, WorkerResources("cpu", 1))
    cluster = cpu_cluster(2)
    student = Policy(policy_config(model_dirs["tied"]), cluster, placement=placement, share=0.5)
    teacher = Policy(
        policy_config(model_dirs["untied"], optimizer=None, scheduler=None),
        cluster,
        optimizer=False,
        name="teacher",
        placement=placement,
        share=0.5,
    )
    try:
        batch = make_batch(4, teacher=False)
        values, indices = teacher.get_topk_logits(batch, 4)
        batch["teacher_topk_logprobs"], batch["teacher_topk_indices"] = values, indices
        metrics = student.train(batch, DistillationLossFn(implementation="torch"))
        assert torch.isfinite(torch.tensor(metrics["loss"])).all()
        assert ray.available_resources().get("CPU", 0) == 0  # both groups hold their halves
    finally:
        student.shutdown()
        teacher.shutdown()
        ray.util.remove_placement_group(placement)
