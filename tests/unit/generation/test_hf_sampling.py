"""hf_sampling.sample, the transformers backend's draw: frequencies against the distribution
(a chi-square bound), filtered tokens never drawn, the token against a float64 inversion of the
same uniform number, one number per row per step, and rows that do not depend on each other."""

import math

import pytest
import torch

from nemo_opd.generation.hf_sampling import row_generators, sample

CHI2_DF5_P1E6 = 35.9
"""The chi-square quantile of 1 - 1e-6 at 5 degrees of freedom: a correct sampler fails the
frequency test once in a million seeds."""


def logprobs_of(probabilities: list[float]) -> torch.Tensor:
    """[V] fp32 log-probs (-inf where the probability is 0, as a filtered token)."""
    return torch.tensor(probabilities, dtype=torch.float64).log().float()


def test_frequencies_follow_the_distribution_and_filtered_tokens_never_win():
    p = [0.05, 0.0, 0.4, 0.1, 0.0, 0.25, 0.15, 0.05]
    rows, steps = 4000, 5
    logprobs = logprobs_of(p).expand(rows, -1).contiguous()
    generators = row_generators(list(range(rows)), torch.device("cpu"))
    counts = torch.zeros(len(p))
    for _ in range(steps):
        counts += torch.bincount(sample(logprobs, generators), minlength=len(p))
    n = rows * steps
    assert counts[1] == 0 and counts[4] == 0
    kept = [i for i, q in enumerate(p) if q > 0]
    chi2 = sum((counts[i].item() - n * p[i]) ** 2 / (n * p[i]) for i in kept)
    assert chi2 < CHI2_DF5_P1E6, (counts.tolist(), chi2)


def test_each_token_is_the_float64_inversion_of_the_rows_own_uniform_number():
    torch.manual_seed(0)
    logprobs = torch.log_softmax(torch.randn(6, 50) * 3, dim=-1)
    logprobs[:, ::7] = -math.inf  # filtered tokens
    logprobs = logprobs - logprobs.logsumexp(dim=-1, keepdim=True)
    seeds = [11, 12, 13, 14, 15, 16]
    drawn = sample(logprobs, row_generators(seeds, torch.device("cpu")))
    for b, seed in enumerate(seeds):
        u = torch.rand((), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        probabilities = logprobs[b].double().exp().tolist()
        target, running = u.item() * sum(probabilities), 0.0
        expected = next(i for i, q in enumerate(probabilities) if (running := running + q) > target)
        assert drawn[b].item() == expected
        assert probabilities[expected] > 0


def test_a_row_draws_one_number_per_step_whatever_rows_are_beside_it():
    torch.manual_seed(1)
    logprobs = torch.log_softmax(torch.randn(3, 151_936), dim=-1)
    alone = row_generators([7], torch.device("cpu"))
    beside = row_generators([1, 7, 2], torch.device("cpu"))
    for _ in range(4):
        assert sample(logprobs[1:2], alone).item() == sample(logprobs, beside)[1].item()
    spent = torch.Generator().manual_seed(7)
    torch.rand(4, generator=spent, dtype=torch.float64)  # four steps, one number each
    assert torch.equal(alone[0].get_state(), spent.get_state())


@pytest.mark.parametrize("where", [0, -1])
def test_all_the_mass_on_one_token_at_either_end_is_always_drawn(where):
    p = [0.0] * 9
    p[where] = 1.0
    logprobs = logprobs_of(p).expand(256, -1).contiguous()
    drawn = sample(logprobs, row_generators(list(range(256)), torch.device("cpu")))
    assert set(drawn.tolist()) == {range(9)[where]}


def test_a_generator_per_row_is_required():
    logprobs = torch.log_softmax(torch.zeros(3, 5), dim=-1)
    with pytest.raises(ValueError, match="1 generators for 3 rows"):
        sample(logprobs, row_generators([0], torch.device("cpu")))


def test_no_generators_is_greedy():
    logprobs = torch.log_softmax(torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]]), dim=-1)
    assert sample(logprobs, None).tolist() == [1, 0]
