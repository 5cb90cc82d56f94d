"""A batch as a dict of tensors sharing the batch dim, and how batches are split into pieces.

`TensorBatch` is what the driver passes to the policy and what the workers pass back:

    input_ids     [B, S] int64   token ids, right-padded
    input_lengths [B]    int64   real tokens per row
    token_mask    [B, S]         1 on trained (assistant/generated) tokens
    sample_mask   [B]            1 for samples that count
    teacher_topk_logprobs [B, S, k] fp32, teacher_topk_indices [B, S, k] int (training only)

Every tensor's dim 0 is the batch dim. Microbatches are formed either with a fixed number of
rows or, with dynamic batching, greedily under a token budget (rows x padded length).
"""

from collections.abc import Iterable, Sequence

import torch


class TensorBatch(dict[str, torch.Tensor]):
    """A dict of tensors that all share dim 0 (the batch dim)."""

    @property
    def size(self) -> int:
        """Rows in the batch (0 for an empty dict)."""
        return next(iter(self.values())).shape[0] if self else 0

    def select(self, rows: torch.Tensor | Sequence[int]) -> "TensorBatch":
        """The given rows, in the given order."""
        index = torch.as_tensor(rows, dtype=torch.long)
        return TensorBatch({k: v.index_select(0, index.to(v.device)) for k, v in self.items()})

    def slice(self, start: int, end: int) -> "TensorBatch":
        """Rows start..end-1 (views)."""
        return TensorBatch({k: v[start:end] for k, v in self.items()})

    def chunk(self, size: int) -> list["TensorBatch"]:
        """Consecutive pieces of `size` rows (the last may be shorter)."""
        return [self.slice(i, i + size) for i in range(0, self.size, size)]

    def to(self, device: torch.device | str) -> "TensorBatch":
        """Every tensor on `device`."""
        return TensorBatch({k: v.to(device) for k, v in self.items()})

    @staticmethod
    def concat(batches: Iterable["TensorBatch"]) -> "TensorBatch":
        """Rows of all batches, in order; tensors with a sequence dim are right-padded to the
        longest (0-padded)."""
        batches = list(batches)
        out = TensorBatch()
        for key in batches[0]:
            parts = [b[key] for b in batches]
            if parts[0].dim() >= 2:
                longest = max(p.shape[1] for p in parts)
                parts = [_pad_dim1(p, longest) for p in parts]
            out[key] = torch.cat(parts, dim=0)
        return out


def _pad_dim1(tensor: torch.Tensor, length: int) -> torch.Tensor:
    """Right-pad dim 1 with zeros to `length`."""
    missing = length - tensor.shape[1]
    if missing == 0:
        return tensor
    pad_shape = (tensor.shape[0], missing, *tensor.shape[2:])
    return torch.cat([tensor, tensor.new_zeros(pad_shape)], dim=1)


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= value."""
    return -(-value // multiple) * multiple


def shard_for_data_parallel(batch: TensorBatch, dp_size: int, rows_per_step: int) -> list:
    """Split a batch over dp ranks so every optimizer step sees the same rows as one process.

    The batch is cut into global batches of `rows_per_step` rows; rank r gets the r-th
    contiguous piece of every global batch, concatenated in step order.

    Returns:
        dp_size TensorBatches of B / dp_size rows each.
    """
    if batch.size % rows_per_step or rows_per_step % dp_size:
        raise ValueError(
            f"batch of {batch.size} rows: needs a multiple of the global batch ({rows_per_step}), "
            f"which needs a multiple of the data-parallel size ({dp_size})"
        )
    local = rows_per_step // dp_size
    steps = batch.size // rows_per_step
    shards = []
    for rank in range(dp_size):
        rows = [s * rows_per_step + rank * local + i for s in range(steps) for i in range(local)]
        shards.append(batch.select(rows))
    return shards


def pad_batch_to_multiple(batch: TensorBatch, multiple: int) -> tuple[TensorBatch, int]:
    """Append copies of row 0 with sample_mask 0 and token_mask 0 until the size divides.

    Returns:
        (the padded batch, the original number of rows).
    """
    size = batch.size
    missing = round_up(size, multiple) - size
    if missing == 0:
        return batch, size
    filler = batch.select([0] * missing)
    for key in ("sample_mask", "token_mask"):
        if key in filler:
            filler[key] = torch.zeros_like(filler[key])
    return TensorBatch.concat([batch, filler]), size


def fixed_microbatches(num_rows: int, rows_per_microbatch: int) -> list[list[int]]:
    """Row indices of consecutive microbatches of `rows_per_microbatch` rows."""
    return [
        list(range(i, min(i + rows_per_microbatch, num_rows)))
        for i in range(0, num_rows, rows_per_microbatch)
    ]


def dynamic_microbatches(lengths: Sequence[int], token_budget: int, round_to: int) -> list:
    """Row indices of microbatches whose padded size (rows x longest rounded length) fits.

    Rows are sorted by length (longest first) so that rows of similar length share a
    microbatch; a row longer than the budget gets a microbatch of its own.

    Returns:
        a list of row-index lists covering every row exactly once.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for row in order:
        longest = round_up(max([lengths[r] for r in current] + [lengths[row]]), round_to)
        if current and longest * (len(current) + 1) > token_budget:
            batches.append(current)
            current = []
        current.append(row)
    if current:
        batches.append(current)
    return batches
