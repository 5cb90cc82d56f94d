"""The learning-rate schedule and atomic checkpoint directories."""

import pytest

from nemo_opd.config import SchedulerConfig
from nemo_opd.policy.optim import lr_factor
from nemo_opd.utils.checkpoint import atomic_directory


def test_schedule_warmup_then_cosine():
    cfg = SchedulerConfig(name="cosine", warmup_steps=2, decay_steps=4, min_lr_ratio=0.1)
    factors = [lr_factor(s, cfg, None) for s in range(8)]
    assert factors[:2] == pytest.approx([1 / 3, 2 / 3])
    assert factors[2] == pytest.approx(1.0)
    assert factors[6] == pytest.approx(0.1) and factors[7] == pytest.approx(0.1)


def test_atomic_directory_keeps_previous_on_failure(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("one")
    with pytest.raises(RuntimeError), atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("two")
        raise RuntimeError("crash mid-save")
    assert (target / "a.txt").read_text() == "one"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("three")
    assert (target / "a.txt").read_text() == "three"
