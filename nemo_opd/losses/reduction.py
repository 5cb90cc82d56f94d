"""How a loss function's metrics combine over chunks, microbatches and ranks.

Metrics are per-token sums already divided by the global valid-token count (they add up to the
global mean), except those named *_min and *_max, which combine by min and max.
"""

import torch


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
