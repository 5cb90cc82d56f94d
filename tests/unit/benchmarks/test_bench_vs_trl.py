"""bench_vs_trl's side that needs no TRL: the settings it derives from a config, and the table
and check it reports (TRL itself is only in the `bench` dependency group)."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_vs_trl  # noqa: E402

TINY = str(REPO / "examples/configs/distillation_tiny.yaml")


def test_settings_match_the_config():
    settings = bench_vs_trl.matched_settings(TINY, [])
    assert settings["rollouts"] == 100 * 32 * 2
    assert (settings["batch_size"], settings["max_steps"]) == (32, 200)  # one step per 32
    assert settings["beta"] == 0.0  # forward KL
    assert (settings["learning_rate"], settings["weight_decay"]) == (1e-3, 0.0)
    assert (settings["max_new_tokens"], settings["temperature"], settings["max_length"]) == (
        48,
        1.0,
        128,
    )
    assert bench_vs_trl.scheduler_args(settings) == {
        "lr_scheduler_type": "cosine_with_min_lr",
        "lr_scheduler_kwargs": {"min_lr_rate": 0.1},
    }
    assert Path(settings["student"], "config.json").is_file()  # tiny:student resolved
    heldout = bench_vs_trl.prompt_records(settings, "validation")  # as the loop reads them
    assert len(heldout) == 500 and set(heldout[0]) >= {"prompt", "answer"}


def test_reverse_kl_is_beta_1_jsd_its_beta_and_other_objectives_are_refused():
    settings = bench_vs_trl.matched_settings(TINY, ["loss_fn.kl_type=reverse"])
    assert settings["beta"] == 1.0
    jsd = ["loss_fn.kl_type=jsd", "loss_fn.jsd_beta=0.3"]
    assert bench_vs_trl.matched_settings(TINY, jsd)["beta"] == 0.3
    with pytest.raises(SystemExit, match="objectives TRL has"):
        bench_vs_trl.matched_settings(TINY, ["loss_fn.kl_type=mixed"])
    with pytest.raises(SystemExit, match="bare prompts"):
        prompt_file = REPO / "examples/prompts/math_boxed.txt"
        bench_vs_trl.matched_settings(TINY, [f"data.prompt_file={prompt_file}"])


def _results(trl_final: float, ours_final: float, trl_wall: float, ours_wall: float) -> dict:
    def points(final, wall):
        return [
            {"step": 1, "elapsed_s": wall / 2, "accuracy": 0.4, "own_accuracy": 0.4, "dir": "x"},
            {"step": 2, "elapsed_s": wall, "accuracy": final, "own_accuracy": final, "dir": "y"},
        ]

    return {
        "settings": {"rollouts": 64},
        "initial_accuracy": 0.3,
        "trl": {"wall_s": trl_wall, "points": points(trl_final, trl_wall)},
        "nemo_opd": {"wall_s": ours_wall, "points": points(ours_final, ours_wall)},
    }


@pytest.mark.parametrize(
    "trl,ours,verdict",
    [
        ((0.55, 100.0), (0.54, 90.0), "check (met)"),  # within two points, faster
        ((0.55, 100.0), (0.52, 90.0), "check (not met)"),  # faster but three points lower
        ((0.55, 100.0), (0.60, 101.0), "check (not met)"),  # better but slower
    ],
)
def test_report_states_the_check(tmp_path, trl, ours, verdict):
    text = bench_vs_trl.report(_results(trl[0], ours[0], trl[1], ours[1]), tmp_path)
    assert verdict in text
    assert (tmp_path / "results.md").read_text().strip() == text
    assert bench_vs_trl.plot(_results(trl[0], ours[0], trl[1], ours[1]), tmp_path).is_file()
