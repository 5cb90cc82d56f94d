"""The refit check's schedule read from a real config (policy.generation.logprob_check_period):
which steps are checked, which weights sample each step, and which weights the loop hands to
the producer. The pipeline's side of it runs in real threads in test_rollout_pipeline.py and
end to end in tests/functional/test_distillation_tiny.py."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from nemo_opd.algorithms import distillation
from nemo_opd.algorithms.step_rollouts import is_checked_step, scheduled_version
from nemo_opd.config import load_config

TINY = Path(__file__).resolve().parents[3] / "examples" / "configs" / "distillation_tiny.yaml"


def config(*overrides: str):
    return load_config(TINY, ["distillation.max_num_steps=12", *overrides])


@pytest.mark.parametrize(
    "overrides, checked, versions",
    [
        # overlapped, checked every 5th step: steps 1, 6, 11 fresh, the others one step stale
        (("distillation.max_staleness=1", "policy.generation.logprob_check_period=5"),
         {1, 6, 11}, [0, 0, 1, 2, 3, 5, 5, 6, 7, 8, 10, 10]),
        # lockstep: every step fresh; the period thins the check only
        (("distillation.max_staleness=0", "policy.generation.logprob_check_period=5"),
         {1, 6, 11}, list(range(12))),
        # overlapped without a period: only the first step samples fresh and is checked
        (("distillation.max_staleness=1", "policy.generation.logprob_check_period=null"),
         {1}, [0] + list(range(11))),
        # no check: the period schedules nothing
        (("distillation.max_staleness=1", "policy.generation.logprob_check=false",
          "policy.generation.logprob_check_period=5"), set(), [0] + list(range(11))),
    ],
)  # fmt: skip
def test_checked_steps_and_their_weights(overrides, checked, versions):
    cfg = config(*overrides)
    steps = range(1, 13)
    # as the loop decides: a checked step whose rollouts the newest weights sampled
    fresh = {t for t in steps if scheduled_version(cfg, t) == t - 1}
    assert {t for t in steps if is_checked_step(cfg, t)} & fresh == checked
    assert [scheduled_version(cfg, t) for t in steps] == versions


class Pipeline:
    def __init__(self):
        self.published: dict[int, object] = {}

    def publish(self, version, weights=None):
        self.published[version] = weights


@pytest.mark.parametrize("staleness, period", [(1, 5), (2, 4), (0, 3), (1, None)])
def test_the_loop_hands_over_exactly_the_weights_a_later_step_samples_from(staleness, period):
    cfg = config(
        f"distillation.max_staleness={staleness}",
        f"policy.generation.logprob_check_period={'null' if period is None else period}",
    )
    state = SimpleNamespace(
        cfg=cfg,
        student=SimpleNamespace(full_weights_ref=lambda: "ref"),
        generation=SimpleNamespace(shares_student=False),
    )
    pipeline = Pipeline()
    for step in range(12):
        distillation._publish(state, pipeline, step)
    assert sorted(pipeline.published) == list(range(12))  # every version is announced
    handed = {version for version, weights in pipeline.published.items() if weights}
    assert handed == {scheduled_version(cfg, t) for t in range(1, 13)}
