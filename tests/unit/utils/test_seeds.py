"""nemo_opd.utils.seeds: a call's seed is a fixed hash of (run seed, purpose, index), and a
request's seed is additive in its row, so a part of a batch samples as in the whole."""

import pytest

from nemo_opd.config.section import MAX_TURNS
from nemo_opd.utils.seeds import TURNS_PER_ROW, call_seed, request_seed


def test_call_seeds_are_a_fixed_hash():
    """Pinned values: a change of the derivation (which would change every run's samples)
    shows here first."""
    assert call_seed(42, "step", 1) == 815669252172879852
    assert call_seed(42, "validation", 0) == 6953173785492366366
    assert len({call_seed(42, "step", s) for s in range(1000)}) == 1000
    assert call_seed(42, "step", 0) != call_seed(42, "validation", 0)
    assert call_seed(42, "step", 3) != call_seed(43, "step", 3)


def test_a_part_seeded_with_its_first_row_samples_as_the_whole():
    base = call_seed(7, "step", 9)
    for first, row, turn in [(0, 5, 0), (4, 3, 2), (1000, 17, TURNS_PER_ROW - 1)]:
        part = request_seed(base, first, 0)
        assert request_seed(part, row, turn) == request_seed(base, first + row, turn)


def test_seeds_stay_below_2_63_and_turns_within_a_row():
    top = 2**63 - 1
    assert request_seed(top, 1, 0) == TURNS_PER_ROW - 1  # wraps, stays an int64
    assert MAX_TURNS <= TURNS_PER_ROW  # distillation.max_rollout_turns never reaches a row's end
    with pytest.raises(ValueError, match="at most 1024 turns"):
        request_seed(0, 0, TURNS_PER_ROW)
