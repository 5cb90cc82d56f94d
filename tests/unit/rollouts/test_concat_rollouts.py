"""concat_rollouts: parts of a batch joined equal the batch's own bookkeeping (rollout_metrics
over all samples; env metrics, which are counts, summed), and a rollout survives the
checkpoint's weights-only round trip."""

import io

import pytest
import torch

from nemo_opd.rollouts import (
    RolloutResult,
    concat_rollouts,
    rollout_from_state,
    rollout_metrics,
    rollout_state,
)
from nemo_opd.rollouts.multi_turn import RolloutState


def states(seed: int, count: int) -> list[RolloutState]:
    rng = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        turns, generated = torch.randint(1, 3, (2,), generator=rng).tolist()
        out.append(RolloutState(turns=turns, generated=generated * 7, natural_stop=bool(turns % 2),
                                truncated=generated == 2, reward=float(turns == 1)))  # fmt: skip
    return out


def rollout_of(part: list[RolloutState], tag: str, graded: float) -> RolloutResult:
    return RolloutResult(
        message_logs=[
            [{"role": "assistant", "content": f"{tag}{i}", "token_ids": [i, 5]}]
            for i in range(len(part))
        ],  # fmt: skip
        rewards=torch.tensor([s.reward for s in part]),
        truncated=torch.tensor([s.truncated for s in part]),
        metadata=[{"answer": f"{tag}{i}", "weights_version": 3} for i in range(len(part))],
        metrics=rollout_metrics(part),
        env_metrics={"env/math/graded": graded, "env/math/fast_path": graded - 1},
    )


@pytest.mark.parametrize("sizes", [(5,), (3, 4), (1, 6, 2)])
def test_parts_joined_equal_the_whole(sizes):
    every = states(0, sum(sizes))
    parts, start = [], 0
    for index, size in enumerate(sizes):
        parts.append(rollout_of(every[start : start + size], f"p{index}-", float(size)))
        start += size
    joined = concat_rollouts(parts)
    assert joined.metrics == pytest.approx(rollout_metrics(every))
    assert joined.env_metrics == {"env/math/graded": sum(sizes),
                                  "env/math/fast_path": sum(sizes) - len(sizes)}  # fmt: skip
    assert torch.equal(joined.rewards, torch.tensor([s.reward for s in every]))
    assert torch.equal(joined.truncated, torch.tensor([s.truncated for s in every]))
    assert [log[0]["content"] for log in joined.message_logs] == [
        log[0]["content"] for part in parts for log in part.message_logs
    ]
    assert len(joined.metadata) == sum(sizes)


def test_a_rollout_round_trips_through_a_weights_only_load():
    rollout = rollout_of(states(1, 3), "r", 3.0)
    buffer = io.BytesIO()
    torch.save({7: rollout_state(rollout)}, buffer)
    buffer.seek(0)
    loaded = rollout_from_state(torch.load(buffer, weights_only=True)[7])
    assert loaded.message_logs == rollout.message_logs and loaded.metadata == rollout.metadata
    assert torch.equal(loaded.rewards, rollout.rewards) and loaded.metrics == rollout.metrics
