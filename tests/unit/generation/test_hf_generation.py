"""VllmGeneration driving HfWorker engines (policy.generation.backend transformers), each a
process of this machine (the processes executor: what an engine computes does not depend on the
executor, test_vllm_generation.py compares an engine in this process with Ray's): the samples of
a seed do not depend on the number of engines, budgets of 0, refit from a dict and from a
Policy's gathered weights (the refit probe), and version skipping."""

import pytest
import torch
from test_vllm_generation import as_batch, student_config
from vllm_testing import (
    TEMPERATURE,
    full_state_dict,
    generation_config,
    load_reference,
    random_prompts,
    reference_token_logprobs,
)

from nemo_opd.config import ClusterConfig
from nemo_opd.generation import VllmGeneration, logprob_mismatch
from nemo_opd.utils.seeds import request_seed

ATOL = 1e-5


def hf_config(**overrides):
    return generation_config(
        backend="transformers", transformers_cfg={"precision": "float32"}, **overrides
    )


@pytest.fixture(scope="module")
def engines(model_dirs):
    """{1: one engine, 2: two engines}, both on model "a", processes of this machine."""
    started = {
        n: VllmGeneration(
            hf_config(),
            model_dirs["a"],
            None,
            device_type="cpu",
            num_engines=n,
            executor="processes",
        )
        for n in (1, 2)
    }
    yield started
    for generation in started.values():
        generation.shutdown()


def test_the_engines_are_transformers_workers(engines):
    import psutil

    [pid] = engines[1].engines.pids()
    assert psutil.Process(pid).name() == "HfWorker"  # its process is named after its class
    assert engines[1].engine_name == "transformers"  # its errors name it so


def test_samples_do_not_depend_on_the_number_of_engines(engines):
    prompts = random_prompts(7, seed=1)
    one = engines[1].generate(prompts, seed=5)
    two = engines[2].generate(prompts, seed=5)
    assert one.token_ids == two.token_ids
    torch.testing.assert_close(
        torch.tensor(one.logprobs), torch.tensor(two.logprobs), atol=ATOL, rtol=0
    )
    tail = engines[2].generate(prompts[4:], seed=request_seed(5, 4, 0))
    assert tail.token_ids == one.token_ids[4:]
    assert engines[2].generate(prompts, seed=6).token_ids != one.token_ids


def test_budgets_of_zero_and_the_default_budget(engines):
    prompts = random_prompts(4, seed=2)
    out = engines[2].generate(prompts, max_new_tokens=[3, 0, 5, 0], seed=0)
    assert [len(ids) for ids in out.token_ids] == [3, 0, 5, 0]
    assert out.finish_reasons == ["length"] * 4
    default = engines[2].generate(prompts[:1], seed=0)
    assert len(default.token_ids[0]) == 16  # cfg.max_new_tokens


def test_refit_from_a_dict_and_version_skipping(engines, model_dirs):
    generation = engines[2]
    reference_a = load_reference(model_dirs["a"])
    torch.manual_seed(0)
    new_model = load_reference(model_dirs["a"])
    with torch.no_grad():
        for param in new_model.parameters():
            param.add_(0.2 * param.std() * torch.randn_like(param))
    pairs = zip(random_prompts(3, seed=3), random_prompts(3, seed=4), strict=True)
    sequences = [p + c for p, c in pairs]

    def scores_match(model) -> bool:
        got = generation.score(sequences)
        want = [reference_token_logprobs(model, s[:1], s[1:]) for s in sequences]
        return all(
            torch.allclose(torch.tensor(g), w, atol=ATOL) for g, w in zip(got, want, strict=True)
        )

    assert scores_match(reference_a)
    try:
        assert generation.refit(full_state_dict(new_model), version=1) is True
        assert scores_match(new_model) and not scores_match(reference_a)
        prompts = random_prompts(2, seed=5)
        out = generation.generate(prompts, seed=1)
        for prompt, ids, logprobs in zip(prompts, out.token_ids, out.logprobs, strict=True):
            expected = reference_token_logprobs(new_model, prompt, ids, TEMPERATURE)
            torch.testing.assert_close(torch.tensor(logprobs), expected, atol=ATOL, rtol=0)
        assert generation.refit(full_state_dict(reference_a), version=1) is False
        assert scores_match(new_model)
    finally:
        generation.refit(full_state_dict(reference_a), version=2)


def test_policy_weights_refit_into_the_transformers_engine(engines, model_dirs):
    """Policy.full_weights_ref() -> refit: the engine's log-probs then equal the student's own
    (the loop's refit probe), from the names the training worker sends."""
    from nemo_opd.policy.policy import Policy

    generation = engines[1]
    cluster = ClusterConfig(num_nodes=1, gpus_per_node=2, device="cpu", cpus_per_worker=1)
    policy = Policy(  # the engines hold model "a"
        student_config(model_dirs["b"]), cluster, executor="processes"
    )
    prompts = random_prompts(4, seed=9)

    def mismatch() -> float:
        out = generation.generate(prompts, seed=2)
        batch, mask = as_batch(prompts, out.token_ids)
        student = policy.get_logprobs(batch, temperature=TEMPERATURE)
        engine = torch.zeros_like(student)
        engine[mask.bool()] = torch.tensor([x for row in out.logprobs for x in row])
        return logprob_mismatch(engine, student, mask)

    try:
        stale = mismatch()
        assert generation.refit(policy.full_weights_ref(), version=100 + policy.step) is True
        assert mismatch() < 1e-4 < 0.05 < stale
    finally:
        policy.shutdown()
        generation.refit(full_state_dict(load_reference(model_dirs["a"])), version=-1)
