"""The tiny example config switches each parallelism on with one override besides the two
workers it needs (the config itself runs one worker per model on two threads); sequence packing
with two, as it replaces the config's dynamic batching (the two are exclusive).

The config is loaded exactly as the example script loads it; only the model is swapped for a
random tiny Qwen3 (the trained tiny assets are not needed to check the wiring). Each layout's
log-probs must equal a single-process Hugging Face forward.
"""

from pathlib import Path

import pytest
from references import load_reference, reference_logprobs
from tiny_policies import executor_for, make_batch

from nemo_opd.config import load_config
from nemo_opd.policy.policy import Policy

TINY_CONFIG = Path(__file__).resolve().parents[3] / "examples/configs/distillation_tiny.yaml"
LOGPROB_ATOL = 2e-5

TWO_WORKERS = ["cluster.gpus_per_node=2", "cluster.cpus_per_worker=1"]
# layout: (its overrides, the (dp, tp, cp) sizes they must give on 2 workers)
OVERRIDES = {
    "tp2": (["policy.dtensor_cfg.tensor_parallel_size=2"], (1, 2, 1)),
    "cp2": (["policy.dtensor_cfg.context_parallel_size=2"], (1, 1, 2)),
    "packing": (
        ["policy.sequence_packing.enabled=true", "policy.dynamic_batching.enabled=false"],
        (2, 1, 1),
    ),
}


@pytest.mark.parametrize("layout", list(OVERRIDES))
def test_one_override_switches_parallelism(layout, model_dirs):
    overrides, sizes = OVERRIDES[layout]
    model = model_dirs["tied"]
    cfg = load_config(
        TINY_CONFIG,
        [*TWO_WORKERS, *overrides, f"policy.model_name={model}", f"teacher.model_name={model}"],
    )
    assert cfg.cluster.world_size == 2
    assert cfg.policy.sequence_packing.enabled == (layout == "packing")
    batch = make_batch(4, seed=5, teacher=False)
    # The tiny config decays its learning rate, which needs the run's length (the loop passes
    # the real one; this test only scores).
    steps = cfg.distillation.max_num_steps
    policy = Policy(
        cfg.policy,
        cfg.cluster,
        name=f"tiny_{layout}",
        total_steps=steps,
        executor=executor_for(cfg.cluster.world_size),
    )
    try:
        assert (policy.dims.dp, policy.dims.tp, policy.dims.cp) == sizes
        logprobs = policy.get_logprobs(batch)
    finally:
        policy.shutdown()
    expected = reference_logprobs(load_reference(model), batch)
    err = (logprobs - expected).abs().max()
    assert err < LOGPROB_ATOL, f"{layout}: logprobs differ by {err:.3g}"
