"""Input checks for the top-k KL.

`check_topk_kl_inputs` looks only at shapes, dtypes and devices: free, and run on every call.
`validate_teacher_topk` looks at the values (index range, duplicates, NaN, total mass):
it costs one device-to-host synchronization, so it is meant to run once per batch where the
teacher's output arrives (or, as a debugging aid, behind the `validate=True` switches of
`topk_kl` and `DistillationLossFn`), never inside the loss or kernel path by default.
"""

import math

import torch
import torch.distributed as dist

EMPTY_INDEX = -1
"""A teacher top-k slot that holds nothing (its log-prob -inf): no bucket of its own, the
student's mass there stays in the tail. A teacher mapped from another vocabulary has them."""


def check_topk_kl_inputs(
    student_logits: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    teacher_indices: torch.Tensor,
    *,
    vocab_start: int = 0,
    tp_group: dist.ProcessGroup | None = None,
) -> None:
    """Raise ValueError on inconsistent shapes, dtypes or devices (no synchronization).

    Expects student_logits [..., V_local], teacher_logprobs and teacher_indices [..., k].
    """
    if not student_logits.is_floating_point():
        raise ValueError(f"student_logits must be a float tensor, got {student_logits.dtype}")
    if not teacher_logprobs.is_floating_point():
        raise ValueError(f"teacher_logprobs must be a float tensor, got {teacher_logprobs.dtype}")
    if teacher_indices.is_floating_point() or teacher_indices.is_complex():
        raise ValueError(f"teacher_indices must be an integer tensor, got {teacher_indices.dtype}")
    if student_logits.dim() < 1 or student_logits.shape[-1] < 1:
        raise ValueError(f"student_logits must be [..., V] with V >= 1, got {student_logits.shape}")
    if teacher_logprobs.shape != teacher_indices.shape:
        raise ValueError(
            f"teacher_logprobs {tuple(teacher_logprobs.shape)} and teacher_indices "
            f"{tuple(teacher_indices.shape)} must have the same shape [..., k]"
        )
    if teacher_logprobs.shape[:-1] != student_logits.shape[:-1]:
        raise ValueError(
            f"leading dims differ: student_logits {tuple(student_logits.shape)} vs teacher "
            f"top-k {tuple(teacher_logprobs.shape)}; expected [..., V] and [..., k]"
        )
    k, vocab = teacher_indices.shape[-1], student_logits.shape[-1]
    if k < 1:
        raise ValueError("teacher top-k must have k >= 1")
    if tp_group is None and k > vocab:
        raise ValueError(f"k = {k} teacher ids exceed the vocabulary size V = {vocab}")
    if tp_group is None and vocab_start != 0:
        raise ValueError("vocab_start != 0 describes a vocab shard: it needs a tp_group")
    if vocab_start < 0:
        raise ValueError(f"vocab_start must be >= 0, got {vocab_start}")
    devices = {student_logits.device, teacher_logprobs.device, teacher_indices.device}
    if len(devices) > 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")


def validate_teacher_topk(
    teacher_logprobs: torch.Tensor,
    teacher_indices: torch.Tensor,
    vocab_size: int,
    *,
    mask: torch.Tensor | None = None,
    mass_tolerance: float = 1e-3,
) -> None:
    """Raise ValueError if the teacher's top-k is malformed at any position selected by `mask`.

    Checks that every id is in [0, vocab_size) or EMPTY_INDEX (whose log-prob must be -inf),
    ids are distinct within a position, log-probs
    are finite or -inf (an id the teacher rules out), and their probabilities sum to at most
    1 + mass_tolerance. One host sync (two
    when an error is reported).

    Args:
        teacher_logprobs: [..., k] float log-probs.
        teacher_indices: [..., k] integer global ids.
        vocab_size: the full (global) vocabulary size.
        mask: optional [...] bool/0-1 tensor; only positions where it is nonzero are checked.
        mass_tolerance: slack on the total probability of the top-k.
    """
    k = teacher_indices.shape[-1]
    ids = teacher_indices.reshape(-1, k).long()
    logprobs = teacher_logprobs.reshape(-1, k).float()
    checked = torch.ones(ids.shape[0], dtype=torch.bool, device=ids.device)
    if mask is not None:
        checked = mask.reshape(-1).to(device=ids.device) != 0
    empty = ids == EMPTY_INDEX
    # empty slots are distinct from everything: each gets its own negative stand-in
    stand_in = -2 - torch.arange(k, device=ids.device).expand_as(ids)
    sorted_ids = torch.where(empty, stand_in, ids).sort(dim=-1).values
    allowed = torch.isfinite(logprobs) | (logprobs == -math.inf)
    total = torch.logsumexp(torch.where(allowed, logprobs, -math.inf), dim=-1)
    out_of_range = (((ids < 0) & ~empty) | (ids >= vocab_size)).any(-1)
    duplicates = (sorted_ids[:, 1:] == sorted_ids[:, :-1]).any(-1)
    filled_empty = (empty & (logprobs != -math.inf)).any(-1)
    problems = {
        f"teacher_topk_indices outside [0, {vocab_size})": out_of_range,
        "duplicate teacher_topk_indices within a position": duplicates,
        f"an empty slot (index {EMPTY_INDEX}) with a log-prob other than -inf": filled_empty,
        "NaN or +inf teacher_topk_logprobs": ~allowed.all(-1),
        f"teacher top-k probabilities summing above 1 + {mass_tolerance:g}": (
            total > math.log1p(mass_tolerance)
        ),
    }
    flags = torch.stack(list(problems.values()), dim=-1) & checked.unsqueeze(-1)
    counts = flags.sum(dim=0).tolist()
    if not any(counts):
        return
    lead = teacher_indices.shape[:-1]
    messages = []
    for column, (name, count) in enumerate(zip(problems, counts, strict=True)):
        if count:
            first = int(flags[:, column].nonzero()[0, 0])
            where = tuple(torch.unravel_index(torch.tensor(first), lead)) if lead else ()
            position = tuple(int(i) for i in where)
            shown = [round(x, 4) for x in logprobs[first].tolist()[:8]]
            messages.append(
                f"{name}: {count} position(s), first at {position}: ids "
                f"{ids[first].tolist()[:8]}, logprobs {shown}"
            )
    raise ValueError("malformed teacher top-k: " + "; ".join(messages))


def global_vocab_size(local_vocab: int, tp_group: dist.ProcessGroup | None) -> int:
    """The full vocabulary size: the sum of the shards' sizes (under tensor parallelism this is
    a collective and a host sync, so call it outside hot paths)."""
    if tp_group is None:
        return local_vocab
    device = "cuda" if dist.get_backend(tp_group) == "nccl" else "cpu"
    size = torch.tensor([local_vocab], device=device)
    dist.all_reduce(size, group=tp_group)
    return int(size.item())
