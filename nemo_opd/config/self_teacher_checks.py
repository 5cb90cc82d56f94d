"""Cross-field checks of a teacher that is the student itself (teacher.source student, ema or
lagged): its workers score between their training calls, so the loop runs in lockstep."""

from nemo_opd.config.schema import DistillationConfig


def check_self_teacher(cfg: DistillationConfig) -> list[str]:
    """teacher.source student, ema or lagged: one teacher (not routed), in lockstep
    (distillation.max_staleness 0), no seq_kd; source student with a prompt_template."""
    problems = [
        f"teachers.{name}.source is {teacher.source!r}: a teacher that is the student itself "
        "cannot be routed among several teachers yet; use `teacher` alone"
        for name, teacher in (cfg.teachers or {}).items()
        if teacher.is_self
    ]
    teacher = cfg.self_teacher
    if teacher is None:
        return problems
    source = f"teacher.source {teacher.source}"
    staleness = cfg.distillation.max_staleness
    if staleness:
        problems.append(
            f"{source} scores on the student's own workers, which would be training while "
            f"the rollouts of the next step are scored (distillation.max_staleness {staleness}); "
            "set distillation.max_staleness to 0"
        )
    if cfg.distillation.seq_kd:
        problems.append(
            f"distillation.seq_kd samples from a teacher model of its own, and {source} has "
            "none; set distillation.seq_kd to false"
        )
    if teacher.source == "student" and teacher.prompt_template is None:
        problems.append(
            "teacher.source student without teacher.prompt_template grades the student with "
            "itself on the same tokens: every divergence is 0; give the teacher a "
            "prompt_template (privileged context), or use source ema or lagged"
        )
    return problems
