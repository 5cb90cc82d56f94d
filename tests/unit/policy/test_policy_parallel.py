"""Every parallel layout on 2 or 4 CPU workers (gloo), and one worker in this process, matches
a single-process HF reference; in the layouts whose code paths differ, the chunked LM head
(policy.logits_chunk_tokens) equals the whole logits.

Each layout checks, on one Policy (layout_runs.run_layout, started once for both tests):
get_logprobs, get_topk_logits (values; ids up to swaps of near-ties), evaluate, the per-step
training loss of two optimizer steps of the top-k divergence, then two of the policy-gradient
loss (clipped, importance-weighted, with the top-k term added), and the parameters after them.
The odd_* models have a vocabulary (301) that tensor parallelism does not divide: the engine
pads it, and everything it returns must still have the real vocabulary.

The chunked head is compared with a Policy of the same layout on the whole logits (null), to
fp32 noise: top-k values and ids and log-probs (at two temperatures), score(trained_only), the
losses and gradient norms of the top-k and policy-gradient steps, and the weights after them,
the LM head's among them; in one process, under vocab-parallel TP (with a padded vocabulary),
context parallel, packing over data parallel and TP x CP (test_megatron_engine: the Megatron
engine under TP).
"""

import pytest
from layout_runs import LayoutRuns, assert_chunked_equals_whole, check_run_against_reference

LAYOUTS = {
    "world1": ("tied", 1, {}),
    "tp2": ("tied", 2, {"dtensor_cfg__tensor_parallel_size": 2}),
    "tp2_untied_ac": (
        "untied",
        2,
        {"dtensor_cfg__tensor_parallel_size": 2, "dtensor_cfg__activation_checkpointing": True},
    ),
    "dp2": ("untied", 2, {}),
    "dp2_dynamic": (
        "tied",
        2,
        {
            "dynamic_batching__enabled": True,
            "dynamic_batching__train_mb_tokens": 48,
            "dynamic_batching__logprob_mb_tokens": 48,
            "dynamic_batching__sequence_length_round": 8,
        },
    ),
    "cp2": ("tied", 2, {"dtensor_cfg__context_parallel_size": 2}),
    "packed_dp2": (
        "untied",
        2,
        {
            "sequence_packing__enabled": True,
            "sequence_packing__train_mb_tokens": 48,
            "sequence_packing__logprob_mb_tokens": 48,
            "sequence_packing__sequence_length_round": 4,
        },
    ),
    "packed_cp2": (
        "tied",
        2,
        {
            "dtensor_cfg__context_parallel_size": 2,
            "sequence_packing__enabled": True,
            "sequence_packing__train_mb_tokens": 64,
            "sequence_packing__logprob_mb_tokens": 64,
            "sequence_packing__sequence_length_round": 1,
        },
    ),
    # policy.make_vocab_size_divisible_by 1: 302 rows, 151 per rank, the last one padding
    "tp2_odd_vocab": (
        "odd_tied",
        2,
        {"dtensor_cfg__tensor_parallel_size": 2, "make_vocab_size_divisible_by": 1},
    ),
    "tp2_cp2_odd_vocab": (
        "odd_tied",
        4,
        {"dtensor_cfg__tensor_parallel_size": 2, "dtensor_cfg__context_parallel_size": 2},
    ),
}


CHUNKED_VS_WHOLE = ["world1", "tp2_odd_vocab", "cp2", "packed_dp2", "tp2_cp2_odd_vocab"]


@pytest.fixture(scope="module")
def runs(model_dirs):
    return LayoutRuns(LAYOUTS, model_dirs)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_matches_reference(layout, runs):
    run = runs.get(layout)
    check_run_against_reference(run, runs.config(layout), runs.model_dir(layout), layout)


@pytest.mark.parametrize("layout", CHUNKED_VS_WHOLE)
def test_chunked_equals_the_whole_logits(layout, runs):
    assert_chunked_equals_whole(runs.get(layout), runs.get(layout, chunked=False))
