"""The advantage functions against float64 references written as plain Python loops over lists
(sharing no code with the vectorized module), on ragged multi-turn batches with NaN wherever
the mask is 0."""

import math
import random

import pytest
import torch

from nemo_opd.algorithms.advantages import (
    ESTIMATORS,
    broadcast_to_tokens,
    compute_advantages,
    discounted_returns,
    group_ids_for,
    reward_advantages,
    sampled_reverse_kl,
)

NAN = float("nan")
EPS = 1e-6

# Rows of different lengths: prompt, assistant turn, tool tokens, assistant turn, padding; one
# long turn; a sample that does not count (empty mask); many short turns up to the last position.
RAGGED_MASK = [
    [0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0],
    [0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    [1, 0, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1],
]


# ----- references: plain Python over lists, float64 -----


def ref_returns(values, mask, gamma):
    out = []
    for row_values, row_mask in zip(values, mask, strict=True):
        positions = [t for t, m in enumerate(row_mask) if m]
        row = [0.0] * len(row_mask)
        for i, p in enumerate(positions):
            total = 0.0
            for j in range(i, len(positions)):
                total += gamma ** (j - i) * row_values[positions[j]]
            row[p] = total
        out.append(row)
    return out


def ref_reverse_kl(student, teacher, mask):
    out = []
    for s_row, t_row, m_row in zip(student, teacher, mask, strict=True):
        out.append([s - t if m else 0.0 for s, t, m in zip(s_row, t_row, m_row, strict=True)])
    return out


def ref_grpo(rewards, groups, normalize_std):
    out = []
    for r, g in zip(rewards, groups, strict=True):
        same = [x for x, h in zip(rewards, groups, strict=True) if h == g]
        mean = sum(same) / len(same)
        if not normalize_std:
            out.append(r - mean)
            continue
        std = math.sqrt(sum((x - mean) ** 2 for x in same) / (len(same) - 1))
        out.append((r - mean) / (std + EPS))
    return out


def ref_rloo(rewards, groups):
    out = []
    for i, (r, g) in enumerate(zip(rewards, groups, strict=True)):
        others = [
            x for j, (x, h) in enumerate(zip(rewards, groups, strict=True)) if h == g and j != i
        ]
        out.append(r - sum(others) / len(others))
    return out


def ref_reinforce_pp(rewards, weights, normalize_std):
    total = sum(weights)
    mean = sum(w * r for w, r in zip(weights, rewards, strict=True)) / total
    var = sum(w * (r - mean) ** 2 for w, r in zip(weights, rewards, strict=True)) / total
    if not normalize_std:
        return [r - mean for r in rewards]
    return [(r - mean) / (math.sqrt(var) + EPS) for r in rewards]


def ref_broadcast(per_sample, mask):
    return [[v if m else 0.0 for m in row] for v, row in zip(per_sample, mask, strict=True)]


def masked_values(rows, mask):
    out = []
    for row, m_row in zip(rows, mask, strict=True):
        out += [value for value, m in zip(row, m_row, strict=True) if m]
    return out


def ref_stats(values):
    """(mean, population std, min, max), all 0.0 for no values."""
    if not values:
        return 0.0, 0.0, 0.0, 0.0
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return mean, std, min(values), max(values)


# ----- batch builders -----


def fill(mask, rng, unmasked=NAN):
    """Random values at masked positions, `unmasked` elsewhere."""
    return [[rng.uniform(-2.0, 2.0) if m else unmasked for m in row] for row in mask]


def random_mask(rng, rows, width):
    """Multi-turn rows: random runs of assistant positions separated by gaps, ragged lengths."""
    mask = []
    for _ in range(rows):
        length = rng.randint(0, width)
        row, t = [], 0
        while t < length:
            run = rng.randint(1, 5)
            on = rng.random() < 0.6
            row += [int(on)] * min(run, length - t)
            t = len(row)
        mask.append(row + [0] * (width - length))
    return mask


def batches():
    """(name, mask) pairs: the hand-written ragged batch and random ones of odd shapes."""
    yield "ragged", RAGGED_MASK
    for seed, (rows, width) in enumerate([(1, 1), (3, 7), (5, 37), (2, 129)]):
        yield f"random{rows}x{width}", random_mask(random.Random(seed), rows, width)


def t64(rows):
    return torch.tensor(rows, dtype=torch.float64)


def assert_matches(actual, expected):
    """fp32 output, no NaN, equal to the float64 reference within fp32 rounding."""
    assert actual.dtype == torch.float32
    assert not actual.isnan().any()
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32))


# ----- sampled_reverse_kl, discounted_returns, broadcast_to_tokens -----


def test_sampled_reverse_kl_is_zero_wherever_masked_even_on_nan_and_inf():
    rng = random.Random(0)
    student = fill(RAGGED_MASK, rng, unmasked=NAN)
    teacher = fill(RAGGED_MASK, rng, unmasked=-math.inf)
    out = sampled_reverse_kl(t64(student), t64(teacher), torch.tensor(RAGGED_MASK).bool())
    assert_matches(out, ref_reverse_kl(student, teacher, RAGGED_MASK))
    assert (out[torch.tensor(RAGGED_MASK) == 0] == 0).all()


def test_discounting_skips_tool_tokens_and_stays_inside_its_row():
    mask = [[0, 1, 1, 0, 0, 1, 0], [1, 1, 0, 0, 0, 0, 0]]
    values = [[NAN, 1.0, 2.0, NAN, NAN, 4.0, NAN], [8.0, 2.0, NAN, NAN, NAN, NAN, NAN]]
    out = discounted_returns(t64(values), torch.tensor(mask, dtype=torch.float32), 0.5)
    # 2 + 0.5 * 4, not 2 + 0.5^3 * 4: the two tool tokens are not discount steps; row 0 ends
    # with its own 4 although row 1 starts on a masked position.
    expected = [[0.0, 3.0, 4.0, 0.0, 0.0, 4.0, 0.0], [9.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
    assert_matches(out, expected)


@pytest.mark.parametrize("gamma", [0.0, 0.9, 1.0, 0.3])
def test_discounted_returns_match_the_reference(gamma):
    for index, (_, mask) in enumerate(batches()):
        values = fill(mask, random.Random(index))
        out = discounted_returns(t64(values), torch.tensor(mask), gamma)
        assert_matches(out, ref_returns(values, mask, gamma))


def test_discounted_returns_of_a_long_row_do_not_overflow():
    width = 3000
    mask = torch.ones(1, width)
    mask[0, ::7] = 0  # tool tokens every few positions
    out = discounted_returns(torch.ones(1, width), mask, 0.5)
    assistant = out[0, mask[0] != 0].double()
    steps_left = torch.arange(assistant.numel(), 0, -1, dtype=torch.float64)
    torch.testing.assert_close(assistant, 2.0 - 2.0 * 0.5**steps_left, check_dtype=False)


def test_discounted_returns_refuse_bad_arguments():
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\], got 1.5"):
        discounted_returns(torch.zeros(2, 3), mask, 1.5)
    with pytest.raises(ValueError, match=r"values must have shape \(2, 3\), got \(2, 4\)"):
        discounted_returns(torch.zeros(2, 4), mask, 0.5)
    with pytest.raises(ValueError, match=r"mask must be \[B, S\], got shape \(6,\)"):
        discounted_returns(torch.zeros(6), torch.ones(6), 0.5)


def test_broadcast_to_tokens_does_not_leak_a_nan_of_an_empty_row():
    per_sample = [0.5, -1.25, NAN, 3.0]
    out = broadcast_to_tokens(t64(per_sample), torch.tensor(RAGGED_MASK))
    assert_matches(out, ref_broadcast(per_sample, RAGGED_MASK))
    with pytest.raises(ValueError, match=r"per_sample must have shape \(4,\), got \(3,\)"):
        broadcast_to_tokens(torch.zeros(3), torch.tensor(RAGGED_MASK))


# ----- group ids and reward advantages -----


def test_group_ids_are_prompt_major():
    assert group_ids_for(3, 2).tolist() == [0, 0, 1, 1, 2, 2]
    assert group_ids_for(0, 4).tolist() == []
    with pytest.raises(ValueError, match="generations_per_prompt >= 1"):
        group_ids_for(2, 0)


# Groups in shuffled order, ragged sizes (4, 4, 3, 2) and ids that are not 0..G-1.
SHUFFLED_GROUPS = [5, 2, 9, 2, 5, 5, 9, 2, 2, 9, 5, -3, -3]


def shuffled_rewards(seed=1):
    rng = random.Random(seed)
    return [rng.choice([0.0, 1.0, rng.uniform(-1.0, 2.0)]) for _ in SHUFFLED_GROUPS]


@pytest.mark.parametrize("normalize_std", [True, False])
def test_grpo_uses_the_statistics_of_each_prompt(normalize_std):
    rewards = shuffled_rewards()
    out = reward_advantages(
        t64(rewards), torch.tensor(SHUFFLED_GROUPS), "grpo", normalize_std=normalize_std
    )
    assert_matches(out, ref_grpo(rewards, SHUFFLED_GROUPS, normalize_std))


def test_grpo_gives_zero_to_a_group_of_equal_rewards():
    rewards = [0.1, 0.1, 0.1, 1.0, 0.0, 1.0, 1.0]
    groups = [0, 0, 0, 1, 1, 1, 1]
    out = reward_advantages(t64(rewards), torch.tensor(groups), "grpo")
    assert not out.isnan().any()
    torch.testing.assert_close(out[:3], torch.zeros(3), atol=1e-6, rtol=0)
    assert_matches(out, ref_grpo(rewards, groups, True))


def test_rloo_subtracts_the_mean_of_the_other_samples():
    rewards = shuffled_rewards(seed=2)
    out = reward_advantages(t64(rewards), torch.tensor(SHUFFLED_GROUPS), "rloo")
    assert_matches(out, ref_rloo(rewards, SHUFFLED_GROUPS))


@pytest.mark.parametrize("normalize_std", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
def test_reinforce_pp_normalizes_over_the_batch(normalize_std, weighted):
    rewards = shuffled_rewards(seed=3)
    counts = [random.Random(i).randint(0, 9) for i in range(len(rewards))]
    weights = counts if weighted else [1] * len(rewards)
    out = reward_advantages(
        t64(rewards),
        torch.tensor(SHUFFLED_GROUPS),
        "reinforce_pp",
        normalize_std=normalize_std,
        token_counts=torch.tensor(counts) if weighted else None,
    )
    assert_matches(out, ref_reinforce_pp(rewards, weights, normalize_std))


def test_reinforce_pp_and_none_need_no_groups():
    rewards = t64([1.0, 0.0, 3.0])
    out = reward_advantages(rewards, None, "reinforce_pp")
    assert_matches(out, ref_reinforce_pp([1.0, 0.0, 3.0], [1, 1, 1], True))
    assert_matches(reward_advantages(rewards, None, "none"), [0.0, 0.0, 0.0])
    empty = reward_advantages(rewards, None, "reinforce_pp", token_counts=torch.zeros(3))
    assert not empty.isnan().any()


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_a_group_of_one_is_refused(estimator):
    groups = torch.tensor([0, 0, 4, 1, 1])
    message = (
        rf"group 4 has group size 1.*{estimator.upper()} needs num_generations_per_prompt >= 2"
    )
    with pytest.raises(ValueError, match=message):
        reward_advantages(torch.ones(5), groups, estimator)
    with pytest.raises(ValueError, match=message):
        reward_advantages(torch.ones(1), torch.tensor([4]), estimator)


def test_reward_advantages_refuse_bad_arguments():
    rewards = torch.ones(4)
    with pytest.raises(ValueError, match="must be one of"):
        reward_advantages(rewards, None, "ppo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'grpo' needs group_ids"):
        reward_advantages(rewards, None, "grpo")
    with pytest.raises(ValueError, match=r"group_ids must have shape \(4,\), got \(3,\)"):
        reward_advantages(rewards, torch.zeros(3, dtype=torch.long), "rloo")
    with pytest.raises(ValueError, match=r"token_counts must have shape \(4,\), got \(4, 1\)"):
        reward_advantages(rewards, None, "reinforce_pp", token_counts=torch.ones(4, 1))
    with pytest.raises(ValueError, match=r"rewards must be \[N\], got shape \(4, 1\)"):
        reward_advantages(torch.ones(4, 1), None, "grpo")
    assert ESTIMATORS == ("none", "grpo", "rloo", "reinforce_pp")


# ----- compute_advantages -----


def combined_inputs(seed=0):
    """The ragged batch with two prompts of two samples each, NaN at unmasked positions."""
    rng = random.Random(seed)
    student = fill(RAGGED_MASK, rng)
    teacher = fill(RAGGED_MASK, rng)
    return student, teacher, [1.0, 0.0, 0.5, 1.0], [1, 0, 1, 0]


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_pp"])
def test_both_terms_are_the_sum_of_the_parts(estimator):
    student, teacher, rewards, groups = combined_inputs()
    mask = torch.tensor(RAGGED_MASK, dtype=torch.float32)
    advantages, metrics = compute_advantages(
        mask,
        rewards=t64(rewards),
        group_ids=torch.tensor(groups),
        student_logprobs=t64(student),
        teacher_logprobs=t64(teacher),
        opd_coef=0.7,
        opd_discount=0.9,
        reward_estimator=estimator,
        reward_coef=2.0,
        normalize_std=True,
    )

    counts = [sum(row) for row in RAGGED_MASK]
    per_sample = {
        "grpo": lambda: ref_grpo(rewards, groups, True),
        "rloo": lambda: ref_rloo(rewards, groups),
        "reinforce_pp": lambda: ref_reinforce_pp(rewards, counts, True),
    }[estimator]()
    kl = ref_reverse_kl(student, teacher, RAGGED_MASK)
    reward_part = ref_broadcast(per_sample, RAGGED_MASK)
    opd_part = ref_returns(kl, RAGGED_MASK, 0.9)
    expected = [
        [2.0 * r - 0.7 * o for r, o in zip(r_row, o_row, strict=True)]
        for r_row, o_row in zip(reward_part, opd_part, strict=True)
    ]
    assert_matches(advantages, expected)

    parts = 2.0 * broadcast_to_tokens(
        reward_advantages(t64(rewards), torch.tensor(groups), estimator, token_counts=mask.sum(1)),
        mask,
    ) - 0.7 * discounted_returns(sampled_reverse_kl(t64(student), t64(teacher), mask), mask, 0.9)
    torch.testing.assert_close(advantages, parts)

    # Reward statistics over the samples that count: row 2 has an empty mask.
    counted = [a for a, c in zip(per_sample, counts, strict=True) if c > 0]
    kl_values = masked_values(kl, RAGGED_MASK)
    mean, std, low, high = ref_stats(masked_values(expected, RAGGED_MASK))
    reward_mean, reward_std, _, _ = ref_stats(counted)
    assert metrics == pytest.approx(
        {
            "advantage_mean": mean,
            "advantage_std": std,
            "advantage_min": low,
            "advantage_max": high,
            "reward_advantage_mean": reward_mean,
            "reward_advantage_std": reward_std,
            "reward_term_mean": ref_stats(masked_values(reward_part, RAGGED_MASK))[0] * 2.0,
            "sampled_reverse_kl": sum(kl_values) / len(kl_values),
            "opd_term_mean": -0.7 * ref_stats(masked_values(opd_part, RAGGED_MASK))[0],
        },
        abs=1e-9,
    )
    # the terms' means add up to the advantages' (what a run's log shows per step)
    assert metrics["reward_term_mean"] + metrics["opd_term_mean"] == pytest.approx(
        metrics["advantage_mean"], abs=1e-12
    )
    assert all(type(value) is float for value in metrics.values())


def test_each_term_alone_and_its_metrics():
    student, teacher, rewards, groups = combined_inputs(seed=4)
    mask = torch.tensor(RAGGED_MASK)
    opd_only, metrics = compute_advantages(
        mask, student_logprobs=t64(student), teacher_logprobs=t64(teacher), opd_coef=1.0
    )
    kl = ref_reverse_kl(student, teacher, RAGGED_MASK)
    assert_matches(opd_only, [[-v for v in row] for row in kl])  # opd_discount 0: -k_t
    assert set(metrics) == {
        "advantage_mean",
        "advantage_std",
        "advantage_min",
        "advantage_max",
        "sampled_reverse_kl",
        "opd_term_mean",
    }
    reward_only, metrics = compute_advantages(
        mask,
        rewards=t64(rewards),
        group_ids=torch.tensor(groups),
        reward_estimator="grpo",
        reward_coef=1.0,
        normalize_std=False,
    )
    assert_matches(reward_only, ref_broadcast(ref_grpo(rewards, groups, False), RAGGED_MASK))
    assert "sampled_reverse_kl" not in metrics and "reward_advantage_std" in metrics


@pytest.mark.parametrize("estimator", ["grpo", "reinforce_pp"])
def test_an_empty_mask_gives_zeros_and_zero_metrics(estimator):
    advantages, metrics = compute_advantages(
        torch.zeros(4, 6),
        rewards=torch.tensor([1.0, 0.0, 0.0, 1.0]),
        group_ids=group_ids_for(2, 2),
        student_logprobs=torch.full((4, 6), NAN),
        teacher_logprobs=torch.full((4, 6), NAN),
        opd_coef=1.0,
        opd_discount=0.9,
        reward_estimator=estimator,
        reward_coef=1.0,
    )
    assert advantages.dtype == torch.float32 and (advantages == 0).all()
    assert len(metrics) == 9 and all(value == 0.0 for value in metrics.values())


def test_advantages_are_fp32_constants_whatever_the_input_dtype():
    student = torch.randn(4, 12, dtype=torch.bfloat16, requires_grad=True)
    advantages, _ = compute_advantages(
        torch.tensor(RAGGED_MASK),
        student_logprobs=student,
        teacher_logprobs=torch.randn(4, 12, dtype=torch.bfloat16),
        opd_coef=1.0,
        opd_discount=0.5,
    )
    assert advantages.dtype == torch.float32 and not advantages.requires_grad


def test_compute_advantages_refuses_missing_inputs_and_bad_shapes():
    mask = torch.tensor(RAGGED_MASK)
    logprobs = torch.zeros(4, 12)
    with pytest.raises(ValueError, match="no advantage term is enabled"):
        compute_advantages(mask)
    with pytest.raises(ValueError, match="no advantage term is enabled"):
        compute_advantages(mask, rewards=torch.ones(4), reward_estimator="grpo", reward_coef=0.0)
    with pytest.raises(ValueError, match="reward_estimator must be one of"):
        compute_advantages(mask, reward_estimator="ppo", reward_coef=1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs rewards"):
        compute_advantages(mask, reward_estimator="rloo", reward_coef=1.0)
    with pytest.raises(ValueError, match="'grpo' needs group_ids"):
        compute_advantages(mask, rewards=torch.ones(4), reward_estimator="grpo", reward_coef=1.0)
    with pytest.raises(ValueError, match=r"rewards must have shape \(4,\), got \(2,\)"):
        compute_advantages(
            mask, rewards=torch.ones(2), reward_estimator="reinforce_pp", reward_coef=1.0
        )
    with pytest.raises(ValueError, match="needs student_logprobs and teacher_logprobs"):
        compute_advantages(mask, student_logprobs=logprobs, opd_coef=1.0)
    with pytest.raises(
        ValueError, match=r"teacher_logprobs must have shape \(4, 12\), got \(4, 11\)"
    ):
        compute_advantages(
            mask, student_logprobs=logprobs, teacher_logprobs=logprobs[:, 1:], opd_coef=1.0
        )
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\]"):
        compute_advantages(
            mask,
            student_logprobs=logprobs,
            teacher_logprobs=logprobs,
            opd_coef=1.0,
            opd_discount=-0.1,
        )
    with pytest.raises(ValueError, match="GRPO needs num_generations_per_prompt >= 2"):
        compute_advantages(
            mask,
            rewards=torch.ones(4),
            group_ids=group_ids_for(4, 1),
            reward_estimator="grpo",
            reward_coef=1.0,
        )
