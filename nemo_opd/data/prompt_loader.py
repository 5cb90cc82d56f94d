"""PromptLoader: fixed-size batches of prompt records in a seeded order, with a resumable
position.

Each epoch is a permutation drawn from (seed, epoch), so the order of any epoch can be rebuilt
from the state dict alone: a resumed run sees exactly the prompts an uninterrupted run would.
"""

import random
from collections.abc import Iterator


class PromptLoader:
    """Batches of `batch_size` records; the last incomplete batch of an epoch is dropped.

    Args:
        records: the dataset (at least batch_size records).
        batch_size: records per batch.
        shuffle: permute the records every epoch.
        seed: the permutation seed.
    """

    def __init__(self, records: list[dict], batch_size: int, shuffle: bool, seed: int) -> None:
        if len(records) < batch_size:
            raise ValueError(
                f"{len(records)} prompts cannot fill one batch of {batch_size} "
                "(distillation.num_prompts_per_step): lower it or add prompts"
            )
        self.records = records
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.batch_index = 0

    @property
    def batches_per_epoch(self) -> int:
        return len(self.records) // self.batch_size

    def __iter__(self) -> Iterator[list[dict]]:
        """Batches from the current position on, across epochs, without end."""
        while True:
            order = self._order(self.epoch)
            while self.batch_index < self.batches_per_epoch:
                start = self.batch_index * self.batch_size
                self.batch_index += 1
                yield [self.records[i] for i in order[start : start + self.batch_size]]
            self.epoch += 1
            self.batch_index = 0

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.records)))
        if self.shuffle:
            random.Random(f"{self.seed}-{epoch}").shuffle(order)
        return order

    @property
    def next_epoch(self) -> int:
        """The epoch the next batch comes from (`epoch` itself advances only when the next batch
        is drawn)."""
        return self.state_dict()["epoch"]

    def state_dict(self) -> dict:
        """The position: the next batch is batch `batch_index` of epoch `epoch`."""
        if self.batch_index >= self.batches_per_epoch:
            return {"epoch": self.epoch + 1, "batch_index": 0}
        return {"epoch": self.epoch, "batch_index": self.batch_index}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = int(state["epoch"])
        self.batch_index = int(state["batch_index"])
