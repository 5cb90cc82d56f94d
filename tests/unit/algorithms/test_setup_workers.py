"""setup_workers.describe_workers: the line a run prints before its workers start."""

from shipped_recipes import CONFIGS, load_recipe

from nemo_opd.algorithms.setup_workers import describe_workers
from nemo_opd.config.worker_split import worker_split
from nemo_opd.generation import backends

ONE_PROCESS = (
    "cluster.executor=local",
    "distillation.max_staleness=0",
    "policy.generation.backend=transformers",
)


def said(*overrides: str) -> str:
    cfg = load_recipe(CONFIGS / "distillation_tiny.yaml", [*ONE_PROCESS, *overrides])
    return describe_workers(cfg, "cpu", worker_split(cfg.cluster, cfg.policy.generation))


def test_a_run_in_one_process_says_whether_its_engine_reads_the_students_module():
    """Where the engine generates from the student's module (backends.shares_student_module),
    the line says so: a refit then copies nothing, and a user reading the log knows why."""
    assert backends.shares_student_module(
        load_recipe(CONFIGS / "distillation_tiny.yaml", list(ONE_PROCESS))
    )
    shared = said()
    assert shared.startswith("workers: one process (cluster.executor local, no Ray): the student")
    assert "1 transformers engine generating from the student's module on " in shared
    copying = said("policy.generation.transformers_cfg.share_student=false")
    assert "1 transformers engine on " in copying
    assert "student's module" not in copying
