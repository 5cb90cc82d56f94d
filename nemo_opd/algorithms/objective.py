"""The objective a config asks for: the training loss (the top-k divergence, the supervised NLL
or the policy gradient), the validation divergence, the temperatures each side uses, and the
lines that name them at start-up."""

from nemo_opd.algorithms.data_mix import on_policy_share
from nemo_opd.config import DistillationConfig
from nemo_opd.losses import DistillationLossFn, NLLLossFn, PolicyGradientLossFn
from nemo_opd.losses.full_vocab_loss import FullVocabDistillationLossFn


def build_loss(cfg: DistillationConfig) -> DistillationLossFn | PolicyGradientLossFn | NLLLossFn:
    """The objective's training loss: the top-k divergence, the supervised NLL, or the
    policy-gradient loss at the sampling temperature (its ratios compare with vLLM's sampling
    log-probs)."""
    if cfg.objective.loss == "topk_kl":
        return distillation_loss(cfg)
    if cfg.objective.loss == "sft":
        return NLLLossFn()
    divergence = distillation_loss(cfg) if cfg.objective.topk_kl_coef > 0 else None
    return PolicyGradientLossFn.from_config(
        cfg.objective, cfg.loss_fn, temperature=sampling_temperature(cfg), topk_kl=divergence
    )


def distillation_loss(cfg: DistillationConfig) -> DistillationLossFn | FullVocabDistillationLossFn:
    """The divergence of loss_fn over its support: the teacher's top-k (DistillationLossFn),
    or the full vocabulary / the student's top-k from the teacher's hidden states."""
    if cfg.loss_fn.support == "teacher_topk":
        return DistillationLossFn.from_config(cfg.loss_fn)
    return FullVocabDistillationLossFn.from_config(
        cfg.loss_fn, k=cfg.distillation.topk_logits_k, teacher_temperature=teacher_temperature(cfg)
    )


def sampling_temperature(cfg: DistillationConfig) -> float:
    """The temperature vLLM samples at (and the policy-gradient loss scores at)."""
    return cfg.policy.generation.temperature or 1.0


def teacher_temperature(cfg: DistillationConfig) -> float:
    """The teacher's temperature: distillation.teacher_temperature, else the loss's."""
    return cfg.distillation.teacher_temperature or cfg.loss_fn.temperature


def print_temperatures(cfg: DistillationConfig) -> None:
    objective = cfg.objective
    student = cfg.loss_fn.temperature
    if objective.loss == "policy_gradient":
        student = sampling_temperature(cfg)
    teacher = f", teacher {teacher_temperature(cfg)}" if objective.uses_teacher else ""
    print(
        f"objective: {_describe_objective(cfg)}\n"
        f"temperatures: sampling {cfg.policy.generation.temperature}, student in the loss "
        f"{student}{teacher}"
    )


def _describe_objective(cfg: DistillationConfig) -> str:
    """One line naming the loss, its enabled terms and the share of on-policy steps."""
    objective = cfg.objective
    if objective.loss == "sft":
        return "supervised NLL of the dataset's responses (no teacher)"
    if objective.loss == "topk_kl":
        topk = f"top-k {cfg.loss_fn.kl_type} divergence (k={cfg.distillation.topk_logits_k})"
        share = on_policy_share(cfg)
        if share < 1.0:
            topk += f", on-policy share {share:g} (lmbda; the rest the dataset's responses)"
        return topk
    terms = []
    if objective.opd_coef > 0:
        terms.append(
            f"{objective.opd_coef} x sampled reverse KL (discount {objective.opd_discount})"
        )
    if objective.uses_reward:
        terms.append(f"{objective.reward_coef} x reward ({objective.reward_estimator})")
    loss = f"policy gradient over advantages {' + '.join(terms)}"
    if objective.topk_kl_coef > 0:
        loss += f", plus {objective.topk_kl_coef} x top-k {cfg.loss_fn.kl_type} divergence"
    return loss
