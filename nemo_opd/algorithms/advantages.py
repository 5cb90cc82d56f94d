"""Per-token advantages for on-policy distillation run as reinforcement learning.

On-policy distillation (OPD) as RL grades each sampled token y_t of a rollout with the
single-sample estimate of the reverse KL between student and teacher,

    k_t = log pi_student(y_t | y_<t) - log pi_teacher(y_t | y_<t),

and uses r_t = -k_t as a dense per-token reward. Its advantage is the discounted return over
the sample's own trained tokens,

    A_opd[p_i] = -opd_coef * sum_{j >= i} gamma^(j - i) * k[p_j],

where p_0 < p_1 < ... are the row's masked positions. A sequence-level reward (a verifier's
score) adds a baseline-subtracted advantage broadcast to every trained token of its sample
(GRPO, RLOO or REINFORCE++), scaled by reward_coef. `compute_advantages` sums the enabled terms.

Conventions: a batch is B samples, each a row of S positions. `mask` [B, S] (float or bool;
any nonzero entry counts as 1) is the position-aligned loss mask: nonzero at the positions whose
next token is a trained assistant token of a sample that counts, 0 at prompt, tool/environment
and padding positions. Per-position inputs are aligned with it; what they hold at unmasked
positions (NaN, inf, garbage) never reaches an output. Samples of the same prompt share a group
id.

Everything is computed in float64 (the tensors are [B, S] or [B], so this is cheap even on a
GPU) and returned as float32. The functions hold no state and do not touch torch.distributed:
call them on the full batch, before it is sharded.
"""

from typing import Literal, get_args

import torch
import torch.nn.functional as F

Estimator = Literal["none", "grpo", "rloo", "reinforce_pp"]
ESTIMATORS: tuple[str, ...] = get_args(Estimator)
"""The sequence-reward estimators of `reward_advantages`."""

_GROUP_ESTIMATOR_NAMES = {"grpo": "GRPO", "rloo": "RLOO"}
_EPS = 1e-6


def sampled_reverse_kl(
    student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """The per-token sampled reverse KL, k_t = student_logprobs - teacher_logprobs.

    Args:
        student_logprobs: [B, S] log-probability of each sampled token under the student.
        teacher_logprobs: [B, S] the same under the teacher.
        mask: [B, S] loss mask (see the module docstring).

    Returns:
        [B, S] float32: k_t at masked positions and exactly 0 elsewhere, whatever the inputs
        hold there.
    """
    valid = _valid_positions(mask)
    return _sampled_reverse_kl64(student_logprobs, teacher_logprobs, valid).float()


def discounted_returns(values: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted reverse cumulative sums over each row's masked positions.

        returns[b, p_i] = sum_{j >= i} gamma^(j - i) * values[b, p_j]

    where p_0 < p_1 < ... are the masked positions of row b. Unmasked positions (tool and
    environment tokens between assistant turns, padding) carry no value and are not discount
    steps: the exponent counts assistant positions only. A sum never leaves its row.

    Args:
        values: [B, S] per-position values (e.g. `sampled_reverse_kl`).
        mask: [B, S] loss mask.
        gamma: discount in [0, 1]; 0 gives values * mask, 1 the undiscounted sum to the end.

    Returns:
        [B, S] float32, 0 at unmasked positions.
    """
    valid = _valid_positions(mask)
    _check_shape("values", values, valid.shape)
    return _discounted_returns64(values.double(), valid, gamma).float()


def group_ids_for(num_prompts: int, generations_per_prompt: int) -> torch.Tensor:
    """Group ids of a prompt-major batch (prompt 0's generations first).

    Returns:
        [num_prompts * generations_per_prompt] int64: [0] * g + [1] * g + ...
    """
    if num_prompts < 0 or generations_per_prompt < 1:
        raise ValueError(
            f"need num_prompts >= 0 and generations_per_prompt >= 1, got {num_prompts} and "
            f"{generations_per_prompt}"
        )
    return torch.arange(num_prompts).repeat_interleave(generations_per_prompt)


def reward_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | None,
    estimator: Estimator,
    *,
    normalize_std: bool = True,
    token_counts: torch.Tensor | None = None,
    eps: float = _EPS,
) -> torch.Tensor:
    """Baseline-subtracted advantages of sequence-level rewards, one per sample.

    With g(i) the group of sample i, mean_g / std_g the group mean and unbiased (n - 1)
    standard deviation, and n_g the group size:

        none:          A_i = 0
        grpo:          A_i = (r_i - mean_g(i)) / (std_g(i) + eps)    (normalize_std=False:
                       A_i = r_i - mean_g(i), the Dr. GRPO form)
        rloo:          A_i = r_i - (sum_{j in g(i), j != i} r_j) / (n_g(i) - 1)
        reinforce_pp:  A_i = (r_i - mu) / (sigma + eps)              (normalize_std=False:
                       A_i = r_i - mu)

    REINFORCE++ ignores the groups: mu and sigma are the mean and population standard deviation
    over the whole batch, weighted by token_counts when given (the statistics of the per-token
    advantages once each reward is broadcast to its sample's tokens), per sample otherwise.
    rloo uses no standard deviation (normalize_std does not apply to it).

    Args:
        rewards: [N] one reward per sample.
        group_ids: [N] integer group (prompt) of each sample, in any order, groups of any
            sizes; needed by grpo and rloo, ignored by the others (may be None).
        estimator: one of ESTIMATORS.
        normalize_std: divide by the standard deviation (grpo, reinforce_pp).
        token_counts: optional [N] number of trained tokens of each sample (reinforce_pp).
        eps: added to the standard deviation.

    Returns:
        [N] float32. A group whose rewards are all equal gets advantage 0.

    Raises:
        ValueError: an unknown estimator, a shape mismatch, missing group_ids, or a group of
            size 1 under grpo/rloo (its baseline needs another sample of the same prompt).
    """
    return _reward_advantages64(
        rewards, group_ids, estimator, normalize_std, token_counts, eps
    ).float()


def broadcast_to_tokens(per_sample: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Spread one value per sample over that sample's masked positions.

    Args:
        per_sample: [B] one value per row (e.g. `reward_advantages`).
        mask: [B, S] loss mask.

    Returns:
        [B, S] float32: per_sample[b] at the masked positions of row b, 0 elsewhere.
    """
    valid = _valid_positions(mask)
    return _broadcast64(per_sample, valid).float()


@torch.no_grad()
def compute_advantages(
    mask: torch.Tensor,
    *,
    rewards: torch.Tensor | None = None,
    group_ids: torch.Tensor | None = None,
    student_logprobs: torch.Tensor | None = None,
    teacher_logprobs: torch.Tensor | None = None,
    opd_coef: float = 0.0,
    opd_discount: float = 0.0,
    reward_estimator: Estimator = "none",
    reward_coef: float = 0.0,
    normalize_std: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The per-token advantages of a batch: the sum of the enabled terms,

        A = reward_coef * broadcast_to_tokens(reward_advantages(rewards, group_ids,
                reward_estimator, token_counts=mask.sum(1)), mask)
            - opd_coef * discounted_returns(sampled_reverse_kl(student, teacher, mask),
                mask, opd_discount)

    The reward term is on when reward_estimator != "none" and reward_coef != 0, the OPD term
    when opd_coef != 0. Advantages are constants of the policy-gradient loss: no autograd
    graph is built. The metrics need one host synchronization.

    Args:
        mask: [B, S] loss mask.
        rewards: [B] sequence rewards (reward term).
        group_ids: [B] group (prompt) ids (reward term with grpo or rloo).
        student_logprobs, teacher_logprobs: [B, S] log-probs of the sampled tokens (OPD term).
        opd_coef, opd_discount: weight and discount gamma of the OPD term.
        reward_estimator, reward_coef, normalize_std: see `reward_advantages`.

    Returns:
        (advantages [B, S] float32, 0 at unmasked positions; metrics, python floats):
        "advantage_mean", "advantage_std" (population), "advantage_min", "advantage_max" over
        the masked positions; with the OPD term "sampled_reverse_kl" (mean k_t over the masked
        positions) and "opd_term_mean" (the term's mean over them); with the reward term
        "reward_advantage_mean" and "reward_advantage_std" (population) over the samples with
        at least one masked position, and "reward_term_mean" (the term's mean over the masked
        positions; advantage_mean is the sum of the terms' means). Statistics over nothing
        are 0.0.

    Raises:
        ValueError: no term enabled, an input an enabled term needs is missing, a shape
            mismatch, or an error of `reward_advantages` / `discounted_returns`.
    """
    valid = _valid_positions(mask)
    if reward_estimator not in ESTIMATORS:
        raise ValueError(f"reward_estimator must be one of {ESTIMATORS}, got {reward_estimator!r}")
    use_reward = reward_estimator != "none" and reward_coef != 0
    use_opd = opd_coef != 0
    if not (use_reward or use_opd):
        raise ValueError(
            "no advantage term is enabled: set opd_coef != 0 (on-policy distillation) and/or "
            f"reward_estimator in {ESTIMATORS[1:]} with reward_coef != 0"
        )
    advantages = torch.zeros(valid.shape, dtype=torch.float64, device=valid.device)
    stats: dict[str, torch.Tensor] = {}
    if use_reward:
        per_sample = _reward_term(rewards, group_ids, valid, reward_estimator, normalize_std)
        term = reward_coef * _broadcast64(per_sample, valid)
        advantages += term
        counted = valid.any(dim=1)
        mean, std, _, _ = _masked_stats(per_sample, counted)
        stats["reward_advantage_mean"], stats["reward_advantage_std"] = mean, std
        stats["reward_term_mean"] = _masked_stats(term, valid)[0]
    if use_opd:
        if student_logprobs is None or teacher_logprobs is None:
            raise ValueError(
                "opd_coef != 0 needs student_logprobs and teacher_logprobs ([B, S] log-probs "
                "of the sampled tokens)"
            )
        kl = _sampled_reverse_kl64(student_logprobs, teacher_logprobs, valid)
        term = -opd_coef * _discounted_returns64(kl, valid, opd_discount)
        advantages += term
        stats["sampled_reverse_kl"] = _masked_stats(kl, valid)[0]
        stats["opd_term_mean"] = _masked_stats(term, valid)[0]
    names = ("advantage_mean", "advantage_std", "advantage_min", "advantage_max")
    overall = dict(zip(names, _masked_stats(advantages, valid), strict=True))
    stats = overall | stats
    values = torch.stack(list(stats.values())).tolist()  # the one host sync
    return advantages.float(), dict(zip(stats, values, strict=True))


def _valid_positions(mask: torch.Tensor) -> torch.Tensor:
    """[B, S] bool: True where the mask is nonzero."""
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, S], got shape {tuple(mask.shape)}")
    return mask != 0


def _check_shape(name: str, tensor: torch.Tensor, shape: torch.Size) -> None:
    if tensor.shape != shape:
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(tensor.shape)}")


def _sampled_reverse_kl64(
    student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    _check_shape("student_logprobs", student_logprobs, valid.shape)
    _check_shape("teacher_logprobs", teacher_logprobs, valid.shape)
    # torch.where, not a product: 0 * NaN at a padding position would be NaN.
    kl = student_logprobs.double() - teacher_logprobs.double()
    return torch.where(valid, kl, 0.0)


def _discounted_returns64(values: torch.Tensor, valid: torch.Tensor, gamma: float) -> torch.Tensor:
    """`discounted_returns` on float64 values and a bool mask, in float64."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"the discount gamma must be in [0, 1], got {gamma}")
    rewards = torch.where(valid, values, 0.0)
    if gamma == 0.0:
        return rewards
    if gamma == 1.0:
        totals = rewards.flip(-1).cumsum(-1).flip(-1)
        return torch.where(valid, totals, 0.0)
    # The backward recurrence acc[t] = decay[t] * acc[t + 1] + rewards[t] (acc[S] = 0), with
    # decay gamma at masked and 1 at unmasked positions, as a log-depth scan: after the pass
    # with offset k, (decay[t], rewards[t]) compose the steps t .. t + 2k - 1, so that
    # acc[t] = decay[t] * acc[t + 2k] + rewards[t]. Past the end the step is the identity
    # (decay 1, reward 0) and acc is 0, so once 2k >= S, acc[t] = rewards[t]. Only products
    # of gammas appear (no division by gamma^t), so nothing overflows for long rows.
    decay = torch.ones_like(rewards).masked_fill(valid, gamma)
    offset = 1
    while offset < valid.shape[1]:
        rewards = rewards + decay * F.pad(rewards[:, offset:], (0, offset), value=0.0)
        decay = decay * F.pad(decay[:, offset:], (0, offset), value=1.0)
        offset *= 2
    return torch.where(valid, rewards, 0.0)


def _reward_advantages64(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | None,
    estimator: str,
    normalize_std: bool,
    token_counts: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    """`reward_advantages` in float64."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"reward estimator must be one of {ESTIMATORS}, got {estimator!r}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be [N], got shape {tuple(rewards.shape)}")
    rewards = rewards.double()
    if estimator == "none":
        return torch.zeros_like(rewards)
    if estimator == "reinforce_pp":
        return _batch_normalized(rewards, token_counts, normalize_std, eps)
    if group_ids is None:
        raise ValueError(f"reward estimator {estimator!r} needs group_ids (one per sample)")
    _check_shape("group_ids", group_ids, rewards.shape)
    index, counts = _group_index(group_ids.to(rewards.device), estimator)
    return _group_advantages(rewards, index, counts, estimator, normalize_std, eps)


def _group_index(group_ids: torch.Tensor, estimator: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's group index [N] (0 .. G - 1) and the group sizes [G]; refuses groups of
    one (a host sync)."""
    unique, index, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    singles = unique[counts < 2]
    if singles.numel() > 0:
        name = _GROUP_ESTIMATOR_NAMES[estimator]
        raise ValueError(
            f"group {singles[0].item()} has group size 1 (and {singles.numel()} group(s) in all):"
            f" {name} needs num_generations_per_prompt >= 2, since a sample's baseline comes"
            " from the other samples of its prompt"
        )
    return index, counts


def _group_advantages(
    rewards: torch.Tensor,
    index: torch.Tensor,
    counts: torch.Tensor,
    estimator: str,
    normalize_std: bool,
    eps: float,
) -> torch.Tensor:
    """grpo / rloo advantages [N] float64 from the group index and sizes (all >= 2)."""
    sizes = counts.to(rewards.dtype)
    sums = torch.zeros_like(sizes).index_add_(0, index, rewards)
    if estimator == "rloo":
        return rewards - (sums[index] - rewards) / (sizes[index] - 1)
    centered = rewards - (sums / sizes)[index]
    if not normalize_std:
        return centered
    squares = torch.zeros_like(sizes).index_add_(0, index, centered.square())
    std = (squares / (sizes - 1)).sqrt()
    return centered / (std[index] + eps)


def _batch_normalized(
    rewards: torch.Tensor, token_counts: torch.Tensor | None, normalize_std: bool, eps: float
) -> torch.Tensor:
    """REINFORCE++: rewards [N] minus the (weighted) batch mean, over the batch std."""
    if token_counts is None:
        weights = torch.ones_like(rewards)
    else:
        _check_shape("token_counts", token_counts, rewards.shape)
        weights = token_counts.to(rewards)
    # A batch without a single trained token has no statistics: use 0 (no NaN).
    total = weights.sum().clamp_min(torch.finfo(rewards.dtype).tiny)
    centered = rewards - (weights * rewards).sum() / total
    if not normalize_std:
        return centered
    std = ((weights * centered.square()).sum() / total).sqrt()
    return centered / (std + eps)


def _reward_term(
    rewards: torch.Tensor | None,
    group_ids: torch.Tensor | None,
    valid: torch.Tensor,
    estimator: Estimator,
    normalize_std: bool,
) -> torch.Tensor:
    """`reward_advantages` [B] float64 for `compute_advantages`, inputs checked."""
    if rewards is None:
        raise ValueError(f"reward_estimator {estimator!r} with reward_coef != 0 needs rewards [B]")
    _check_shape("rewards", rewards, valid.shape[:1])
    if estimator in _GROUP_ESTIMATOR_NAMES and group_ids is None:
        raise ValueError(f"reward_estimator {estimator!r} needs group_ids [B] (prompt of each row)")
    rewards = rewards.to(valid.device)
    if group_ids is not None:
        group_ids = group_ids.to(valid.device)
    token_counts = valid.sum(dim=1)
    return _reward_advantages64(rewards, group_ids, estimator, normalize_std, token_counts, _EPS)


def _broadcast64(per_sample: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    _check_shape("per_sample", per_sample, valid.shape[:1])
    values = per_sample.to(device=valid.device, dtype=torch.float64).unsqueeze(1)
    return torch.where(valid, values, 0.0)


def _masked_stats(x: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(mean, population std, min, max) of x over the valid entries, as 0-d tensors; all 0
    when nothing is valid. No host sync."""
    count = valid.sum()
    n = count.clamp_min(1).to(torch.float64)
    mean = torch.where(valid, x, 0.0).sum() / n
    std = (torch.where(valid, (x - mean).square(), 0.0).sum() / n).sqrt()
    # The padding entry keeps amin/amax defined on an empty batch.
    low = F.pad(torch.where(valid, x, torch.inf).flatten(), (0, 1), value=torch.inf).amin()
    high = F.pad(torch.where(valid, x, -torch.inf).flatten(), (0, 1), value=-torch.inf).amax()
    empty = count == 0
    return mean, std, torch.where(empty, 0.0, low), torch.where(empty, 0.0, high)
