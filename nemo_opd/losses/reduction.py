"""How a loss function's metrics combine over chunks, microbatches and ranks.

Metrics are per-token sums already divided by the global valid-token count (they add up to the
global mean), except those named *_min and *_max, which combine by min and max.
"""

import torch
import torch.distributed as dist

from nemo_opd.distributed.collectives import all_reduce


def metric_reduction(name: str) -> str:
    """How a loss metric combines over microbatches and ranks: "min" for names ending in _min,
    "max" for _max, "sum" for the rest (per-token sums already divided by the global count)."""
    for kind in ("min", "max"):
        if name.endswith(f"_{kind}"):
            return kind
    return "sum"


def accumulate_metrics(totals: dict[str, torch.Tensor], metrics: dict[str, torch.Tensor]) -> None:
    """Fold one part's metrics (a chunk's, a microbatch's) into the running totals, in place
    (metric_reduction's rule)."""
    combine = {"sum": torch.add, "min": torch.minimum, "max": torch.maximum}
    for name, value in metrics.items():
        value = value.detach().float()
        total = totals.get(name)
        totals[name] = value if total is None else combine[metric_reduction(name)](total, value)


def reduce_over_ranks(
    sums: dict[str, torch.Tensor], group: dist.ProcessGroup, device: torch.device
) -> dict[str, float]:
    """Reduce per-rank metrics over `group` (an engine's dp and cp ranks; tp ranks hold copies):
    sums in one all-reduce, *_min and *_max in one more each."""
    reduced = {}
    for op, names in _names_by_reduction(sums).items():
        if not names:
            continue
        stacked = torch.stack([torch.as_tensor(sums[n], device=device) for n in names])
        all_reduce(stacked, group, op)
        reduced.update(zip(names, stacked.tolist(), strict=True))
    return reduced


def _names_by_reduction(sums: dict) -> dict[dist.ReduceOp, list[str]]:
    ops = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
    grouped: dict = {op: [] for op in ops.values()}
    for name in sorted(sums):
        grouped[ops[metric_reduction(name)]].append(name)
    return grouped
