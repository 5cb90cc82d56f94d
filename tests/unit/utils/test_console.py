"""The live console fits the terminal's width: at 80 columns the per-step table shows the step,
the loss and the held-out accuracy whole (it was cut to `0.…` in every cell), the progress line
fits; a wide terminal shows every column."""

import io
import re

import pytest
from rich.console import Console

from nemo_opd.utils.console import StepConsole, fit_columns

METRICS = {
    "train/loss": 0.09229,
    "train/forward_kl": 0.09229,
    "train/reverse_kl": 0.2555,
    "train/reward": 0.4219,
    "validation/accuracy": 0.606,
    "timing/train/total_step_time": 0.4512,
    "timing/train/rollout_wait": 0.0123,
    "timing/train/policy_training": 0.2871,
    "timing/train/refit": 0.0311,
    "timing/train/generation": 0.2214,
    "timing/train/teacher_topk": 0.0811,
    "timing/train/logprob_check": 0.0412,
    "train/tokens_per_sec": 23456.7,
}
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")


def screen(width: int) -> list[str]:
    """The lines a terminal `width` columns wide shows for the last step of a run."""
    buffer = io.StringIO()
    terminal = Console(file=buffer, force_terminal=True, width=width, color_system=None)
    console = StepConsole(350, start_step=349, console=terminal)
    console.update(350, METRICS)
    console.close()
    text = ESCAPES.sub("", buffer.getvalue()).replace("\r", "\n")
    return [line.rstrip() for line in text.splitlines() if line.strip()]


def table(lines: list[str]) -> dict[str, str]:
    """{label: value} of the per-step table (its header and its row)."""
    header = next(index for index, line in enumerate(lines) if line.split()[:2] == ["step", "loss"])
    return dict(zip(lines[header].split(), lines[header + 2].split(), strict=True))


def test_at_80_columns_the_loss_and_accuracy_are_whole():
    lines = screen(80)
    assert all(len(line) <= 80 for line in lines)
    assert "…" not in "".join(lines)
    cells = table(lines)
    assert cells["step"] == "350" and cells["loss"] == "0.09229" and cells["val_acc"] == "0.606"
    assert cells["reward"] == "0.4219"
    bar = lines[-1]
    assert bar.startswith("step ") and "350/350" in bar and "loss=0.09229" in bar


def test_a_wide_terminal_shows_every_column():
    lines = screen(200)
    assert list(table(lines)) == [
        "step",
        "loss",
        "fwd_kl",
        "rev_kl",
        "reward",
        "val_acc",
        "step_s",
        "rollout_wait_s",
        "policy_training_s",
        "refit_s",
        "generation_s",
        "teacher_topk_s",
        "logprob_check_s",
        "tok/s",
    ]
    assert "loss=0.09229 reward=0.4219 fwd_kl=0.09229 rev_kl=0.2555" in lines[-1]


@pytest.mark.parametrize("width", [20, 40, 80, 120])
def test_fit_columns_keeps_the_step_first_then_the_loss_accuracy_and_reward(width):
    cells = [("step", "350"), ("loss", "0.1"), ("fwd_kl", "0.2"), ("reward", "0.5")]
    cells += [("val_acc", "0.606"), ("step_s", "0.45")]
    kept = fit_columns(cells, width)
    assert kept[0] == ("step", "350")
    assert sum(max(len(a), len(b)) + 3 for a, b in kept) <= max(width, 7)
    labels = [label for label, _ in kept]
    assert labels == sorted(labels, key=[label for label, _ in cells].index)  # in their order
    if width >= 30:
        assert {"loss", "val_acc", "reward"} <= set(labels)
