"""bench_vs_trl_wide.py's pieces that decide its verdict: the steady-state figures, the check
and the table; harness.PeakMemory's peaks and its cap on real processes; the TRL child's
count of sampled tokens through a real generate call."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_vs_trl  # noqa: E402
import bench_vs_trl_wide as wide  # noqa: E402
from harness import PeakMemory  # noqa: E402

GIB = 2**30


def run(seconds=None, tokens=2048, pss_gib=8.0, fits=True):
    out = {"fits": fits, "exit": 0, "peak_bytes": {"driver": int(pss_gib * GIB)}}
    out |= {"peak_total_bytes": int(pss_gib * GIB), "peak_pss_bytes": int(pss_gib * GIB)}
    out |= {"wall_s": 100.0}
    if seconds is not None:
        out |= {"seconds_per_step": seconds, "sampled_tokens_per_step": tokens}
        out["tokens_per_s"] = tokens / seconds
    return out


def test_steady_state_leaves_out_the_first_step():
    figures = wide.steady([90.0, 10.0, 12.0, 11.0], [100, 200, 200, 200])
    assert figures == {
        "seconds_per_step": 11.0,
        "sampled_tokens_per_step": 200,
        "tokens_per_s": 200 / 11.0,
    }
    assert wide.steady([90.0], [100]) == {}


@pytest.mark.parametrize(
    ("runs", "verdict"),
    [
        # 2x the rate of TRL's fastest, no more memory than TRL's leanest: met
        ({"trl_gkd": run(60, pss_gib=18), "trl_distillation": run(50, pss_gib=8),
          "nemo_opd": run(25, pss_gib=8)}, "check: met: nemo_opd, lockstep: 2.00x"),
        # fast enough but more memory than TRL's leanest
        ({"trl_distillation": run(50, pss_gib=8), "nemo_opd": run(20, pss_gib=8.5)},
         "check: not met"),
        # lean enough but not fast enough
        ({"trl_distillation": run(50, pss_gib=8), "nemo_opd": run(30, pss_gib=1)},
         "check: not met"),
        # one run fast, the other lean: neither meets both
        ({"trl_distillation": run(50, pss_gib=8), "nemo_opd": run(30, pss_gib=1),
          "nemo_opd_staleness1": run(20, pss_gib=9)}, "check: not met"),
        # the overlapped run meets both where the lockstep one is too slow
        ({"trl_distillation": run(50, pss_gib=8), "nemo_opd": run(30, pss_gib=6),
          "nemo_opd_staleness1": run(22, pss_gib=7.9)},
         "check: met: nemo_opd, max_staleness 1"),
        # TRL does not fit where nemo_opd does
        ({"trl_gkd": run(fits=False), "trl_distillation": run(fits=False),
          "nemo_opd": run(40, pss_gib=15)}, "check: met (TRL does not fit"),
        # nemo_opd did not finish
        ({"trl_gkd": run(60), "nemo_opd": run(fits=False)}, "check: not met (no nemo_opd"),
        ({"nemo_opd": run(30)}, "check: no TRL run"),
    ],
)  # fmt: skip
def test_the_check(runs, verdict):
    assert wide.check(runs).startswith(verdict)


def test_the_table_names_runs_that_did_not_fit():
    runs = {"trl_gkd": run(fits=False, pss_gib=20.5), "nemo_opd_staleness1": run(25.0)}
    table = wide.report({"runs": runs})
    assert "| TRL GKDTrainer, float32 | did not fit | - | - | 20.50 |" in table
    assert "| nemo_opd, max_staleness 1 | 25.0 | 2048 | 82 |" in table


def test_the_settings_are_one_config_for_both_sides():
    args = type("Args", (), {"rollouts": 8, "steps": 3, "max_new_tokens": 32})()
    pair = {"student": "tiny:student", "teacher": "tiny:teacher"}
    settings = bench_vs_trl.matched_settings(
        str(ROOT / "examples/configs/distillation_tiny.yaml"), wide.overrides_for(pair, args)
    )
    assert settings["batch_size"] == 8 and settings["rollouts"] == 24
    assert settings["max_steps"] == 3 and settings["max_new_tokens"] == 32


def hold(mib: int) -> list[str]:
    """A process that holds `mib` MiB of touched memory for a few seconds."""
    code = f"import time; block = bytearray({mib} * 2**20); time.sleep(4)"
    return [sys.executable, "-c", code]


def test_peak_memory_sees_a_child_and_its_own_child():
    parent = textwrap.dedent(f"""
        import subprocess, sys, time
        subprocess.run({hold(200)!r})
    """)
    process = subprocess.Popen([sys.executable, "-c", parent])
    memory = PeakMemory(process.pid)
    assert process.wait(timeout=60) == 0
    peaks = memory.stop()
    assert max(peaks.values()) > 200 * 2**20
    assert memory.peak_total > 200 * 2**20 and memory.peak_pss > 0
    assert not memory.capped


def test_peak_memory_kills_a_run_over_its_cap():
    process = subprocess.Popen(hold(400))
    memory = PeakMemory(process.pid, cap_bytes=200 * 2**20)
    assert process.wait(timeout=60) != 0  # killed before its sleep ended
    memory.stop()
    assert memory.capped


def test_the_trl_child_counts_the_tokens_generate_samples():
    import torch
    from transformers import AutoModelForCausalLM, GenerationMixin

    from nemo_opd.tiny import resolve_pretrained

    model = AutoModelForCausalLM.from_pretrained(resolve_pretrained("tiny:student"))
    counts: list[int] = []
    pad = 0
    original = GenerationMixin.generate
    try:
        bench_vs_trl.count_sampled_tokens(pad, counts)
        prompt = torch.tensor([[5, 6, 7], [8, 9, 10]])
        out = model.generate(input_ids=prompt, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    finally:
        GenerationMixin.generate = original
    assert counts == [int((out[:, 3:] != pad).sum())]
    assert counts[0] > 0
