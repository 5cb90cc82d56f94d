"""bench_vs_trl's side that needs no TRL: the settings it derives from a config, and the table
and check it reports (TRL itself is only in the `bench` dependency group)."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_vs_trl  # noqa: E402

TINY = str(REPO / "examples/configs/distillation_tiny_100.yaml")


def test_settings_match_the_config():
    settings = bench_vs_trl.matched_settings(TINY, [])
    assert settings["rollouts"] == 100 * 32 * 2
    assert settings["max_staleness"] == 1  # the recipe overlaps, as the default does
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


def _results(trl: dict, ours: tuple[float, float]) -> dict:
    def points(final, wall):
        return [
            {"step": 1, "elapsed_s": wall / 2, "accuracy": 0.4, "own_accuracy": 0.4, "dir": "x"},
            {"step": 2, "elapsed_s": wall, "accuracy": final, "own_accuracy": final, "dir": "y"},
        ]

    systems = {name: {"wall_s": w, "points": points(a, w)} for name, (a, w) in trl.items()}
    return {
        "settings": {"rollouts": 64},
        "initial_accuracy": 0.3,
        **systems,
        "nemo_opd": {"wall_s": ours[1], "points": points(ours[0], ours[1])},
    }


GKD_ONLY = {"trl_gkd": (0.55, 100.0)}
BOTH = {"trl_gkd": (0.55, 100.0), "trl_distillation": (0.50, 80.0)}


@pytest.mark.parametrize(
    "trl,ours,verdict",
    [
        (GKD_ONLY, (0.545, 90.0), "check (met, against TRL's fastest, TRL GKDTrainer)"),
        (GKD_ONLY, (0.53, 90.0), "check (not met"),  # faster but two points lower
        (GKD_ONLY, (0.60, 101.0), "check (not met"),  # better but slower
        # against the faster of TRL's two trainers, whatever the slower one reached
        (BOTH, (0.50, 85.0), "check (not met, against TRL's fastest, TRL DistillationTrainer)"),
        (BOTH, (0.50, 79.0), "check (met, against TRL's fastest, TRL DistillationTrainer)"),
    ],
)
def test_report_states_the_check(tmp_path, trl, ours, verdict):
    text = bench_vs_trl.report(_results(trl, ours), tmp_path)
    assert verdict in text
    assert "TRL GKDTrainer" in text and "+15.0%" in text  # 0.3 -> 0.55 over 100 s, per minute
    assert (tmp_path / "results.md").read_text().strip() == text
    assert bench_vs_trl.plot(_results(trl, ours), tmp_path).is_file()


def test_the_report_says_how_on_policy_each_sides_rollouts_were():
    said = bench_vs_trl.rollouts_said
    assert said({"rollouts": 6400, "max_staleness": 0}) == "6400 on-policy rollouts"
    overlapped = said({"rollouts": 6400, "max_staleness": 1})
    assert overlapped == (
        "6400 rollouts (TRL's on-policy, nemo_opd's sampled from weights one step older)"
    )
    assert "up to 2 steps older" in said({"rollouts": 64, "max_staleness": 2})


def test_speed_settings_turn_off_what_slows_trl():
    settings = bench_vs_trl.matched_settings(TINY, [])
    common = bench_vs_trl.speed_args(settings, Path("unused"))
    assert common["gradient_checkpointing"] is False and common["bf16"] is False
    assert common["per_device_train_batch_size"] == settings["batch_size"]


def test_trl_validates_where_the_loop_does():
    settings = bench_vs_trl.matched_settings(TINY, [])
    assert settings["validation_steps"] == [0, 100, 200]  # loop steps 0, 50, 100; 2 per step
    fewer = ["distillation.val_at_start=false", "distillation.val_at_end=false"]
    assert bench_vs_trl.matched_settings(TINY, fewer)["validation_steps"] == [100, 200]
