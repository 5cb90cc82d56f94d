"""A resumed overlapped run: the checkpoint's rollouts are used only where the schedule of this
run samples from the weights that made them, and a step whose scheduled weights are gone (and
whose rollouts were not saved) samples from the resumed weights, with a printed line."""

from pathlib import Path
from types import SimpleNamespace

import torch

from nemo_opd.algorithms.rollout_pipeline import version_for
from nemo_opd.algorithms.step_rollouts import (
    VERSION_KEY,
    _sampling_version,
    keep_only_scheduled,
)
from nemo_opd.config import load_config
from nemo_opd.rollouts import RolloutResult

ROOT = Path(__file__).resolve().parents[3]


def state_at(step: int, staleness: int) -> SimpleNamespace:
    cfg = load_config(ROOT / "examples" / "configs" / "distillation_tiny.yaml",
                      [f"distillation.max_staleness={staleness}"])  # fmt: skip
    return SimpleNamespace(cfg=cfg, resumed_step=step, saved_rollouts={})


def sampled_by(version: int) -> RolloutResult:
    return RolloutResult([[]] * 2, torch.zeros(2), torch.zeros(2, dtype=torch.bool),
                         [{VERSION_KEY: version}, {VERSION_KEY: version}])  # fmt: skip


def test_saved_rollouts_that_fit_the_schedule_are_kept(capsys):
    state = state_at(10, staleness=2)
    keep_only_scheduled(state, {11: sampled_by(8), 12: sampled_by(9)})
    assert sorted(state.saved_rollouts) == [11, 12] and capsys.readouterr().out == ""
    assert [_sampling_version(state, s) for s in (11, 12, 13)] == [8, 9, 10]


def test_rollouts_of_another_staleness_are_sampled_again_from_the_resumed_weights(capsys):
    state = state_at(10, staleness=1)  # saved by a run at max_staleness 2
    keep_only_scheduled(state, {11: sampled_by(8), 12: sampled_by(9)})
    out = capsys.readouterr().out
    assert state.saved_rollouts == {}
    assert "step 11: the checkpoint's rollouts were sampled from the weights of step 8, " in out
    assert "not 9 as distillation.max_staleness=1 schedules" in out
    assert version_for(11, 1) == 9 < state.resumed_step
    assert _sampling_version(state, 11) == 10  # weights 9 are gone: the resumed ones
    assert "sampling them from step 10's weights" in capsys.readouterr().out
    assert _sampling_version(state, 12) == 10 == version_for(12, 1)
