"""NeMo-RL's learning-rate schedules -> the scheduler section here (name, warmup_steps,
min_lr_ratio, decay_steps).

NeMo-RL's DTensor schedule is a list of torch schedulers chained by SequentialLR at
`milestones`; its Megatron schedule is megatron-core's (lr_decay_style, lr_warmup_iters,
lr_decay_iters, min_lr). The shapes both have in common with ours convert: a linear warmup,
then a constant, cosine or linear learning rate. Where they differ:
- a LinearLR warmup starts at start_factor x lr (Megatron's at lr_warmup_init); ours at 0;
- torch's CosineAnnealingLR rises again after T_max; ours stays at its minimum;
- Megatron counts lr_decay_iters from step 0, ours decay_steps from the end of the warmup.
Any other shape becomes a constant learning rate, and the row says so.
"""

from dataclasses import dataclass, field
from typing import Any

from nemo_opd.nemo_rl_keys import Kind


@dataclass
class Schedule:
    """A converted schedule: the section here, whether it is the same schedule (renamed) or
    only the nearest one (changed), and why."""

    section: dict[str, Any]
    kind: Kind = "renamed"
    notes: list[str] = field(default_factory=list)


def convert_torch_schedule(items: Any, lr: Any) -> Schedule:
    """NeMo-RL's list of torch schedulers (with `milestones`) -> a Schedule."""
    if not isinstance(items, list) or not items:
        return Schedule({"name": "constant", "warmup_steps": 0})
    steps = [_torch_step(item) for item in items if isinstance(item, dict) and "name" in item]
    milestones = next(
        (item["milestones"] for item in items if isinstance(item, dict) and "milestones" in item),
        [],
    )
    schedule = Schedule({"name": "constant", "warmup_steps": 0})
    if len(steps) == 2 and len(milestones) == 1 and _is_warmup(steps[0]):
        _warmup(schedule, steps[0], milestones[0])
        steps = steps[1:]
    elif len(steps) == 1 and _is_warmup(steps[0]):
        _warmup(schedule, steps[0], steps[0][1].get("total_iters", 5))
        return schedule
    if len(steps) != 1 or not _after_warmup(schedule, steps[0], lr):
        names = ", ".join(name for name, _ in steps) or "no scheduler"
        return Schedule(
            {"name": "constant", "warmup_steps": 0},
            "changed",
            [f"{names} is not a shape here (warmup, then constant, cosine or linear): constant lr"],
        )
    return schedule


def _torch_step(item: dict) -> tuple[str, dict]:
    """(the scheduler's class name, its kwargs)."""
    return str(item["name"]).rsplit(".", 1)[-1], dict(item.get("kwargs") or {})


def _is_warmup(step: tuple[str, dict]) -> bool:
    name, kwargs = step
    return (
        name == "LinearLR"
        and kwargs.get("end_factor", 1.0) == 1.0
        and (kwargs.get("start_factor", 1 / 3) < 1.0)
    )


def _warmup(schedule: Schedule, step: tuple[str, dict], length: int) -> None:
    start = step[1].get("start_factor", 1 / 3)
    schedule.section["warmup_steps"] = int(length)
    schedule.kind = "changed"
    schedule.notes.append(f"the warmup starts from 0 here, from {start:g} x lr in NeMo-RL")


def _after_warmup(schedule: Schedule, step: tuple[str, dict], lr: Any) -> bool:
    """Set the shape after the warmup from one torch scheduler; False if it has none here."""
    name, kwargs = step
    section = schedule.section
    if name == "ConstantLR" and kwargs.get("factor", 1 / 3) == 1.0:
        section["name"] = "constant"
        return True
    if name == "CosineAnnealingLR" and "T_max" in kwargs:
        section.update(name="cosine", decay_steps=int(kwargs["T_max"]))
        _min_ratio(schedule, kwargs.get("eta_min", 0.0), lr)
        schedule.notes.append("after T_max the learning rate stays at its minimum here")
        return True
    if name == "LinearLR" and kwargs.get("start_factor", 1 / 3) == 1.0:
        section.update(name="linear", decay_steps=int(kwargs.get("total_iters", 5)))
        section["min_lr_ratio"] = float(kwargs.get("end_factor", 1.0))
        return True
    return False


def _min_ratio(schedule: Schedule, min_lr: Any, lr: Any) -> None:
    if isinstance(lr, int | float) and lr > 0 and isinstance(min_lr, int | float):
        schedule.section["min_lr_ratio"] = min(1.0, float(min_lr) / float(lr))
    else:
        schedule.notes.append("no lr to express the minimum as a ratio: min_lr_ratio 0")


def convert_megatron_schedule(scheduler: Any, optimizer: Any) -> Schedule:
    """Megatron's scheduler section (with its optimizer's lr and min_lr) -> a Schedule."""
    scheduler = scheduler if isinstance(scheduler, dict) else {}
    optimizer = optimizer if isinstance(optimizer, dict) else {}
    style = scheduler.get("lr_decay_style", "linear")
    warmup = int(scheduler.get("lr_warmup_iters") or 0)
    schedule = Schedule({"name": "constant", "warmup_steps": warmup})
    if style in ("cosine", "linear"):
        schedule.section["name"] = style
        decay = scheduler.get("lr_decay_iters")
        if isinstance(decay, int) and decay > warmup:
            schedule.section["decay_steps"] = decay - warmup
        _min_ratio(schedule, optimizer.get("min_lr", 0.0), optimizer.get("lr"))
    elif style != "constant":
        schedule.kind = "changed"
        schedule.notes.append(f"lr_decay_style {style!r} is not a shape here: constant lr")
    if warmup and scheduler.get("lr_warmup_init", 0.0):
        schedule.kind = "changed"
        init = scheduler["lr_warmup_init"]
        schedule.notes.append(f"the warmup starts from 0 here, from lr_warmup_init {init:g}")
    if scheduler.get("weight_decay_incr_style", "constant") != "constant":
        schedule.kind = "changed"
        schedule.notes.append("weight decay is constant here")
    return schedule
