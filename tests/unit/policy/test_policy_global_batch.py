"""Policy.train with a global batch smaller than the config's: the off-policy steps' way of
training each prompt's response once (the loop's _reference_copies). One copy of each row with a
global batch g times smaller takes the same optimizer steps as g identical copies with the
config's global batch: checked on 2 data-parallel workers against the single-process HF
reference trained on the copies."""

import torch
from references import load_reference, reference_train
from tiny_policies import make_batch, policy_config, running_policy

from nemo_opd.losses import DistillationLossFn, TopkKLParams

COPIES = 2
K = 4


def test_one_copy_with_a_smaller_global_batch_trains_as_the_copies(model_dirs):
    cfg = policy_config(model_dirs["tied"], train_global_batch_size=8)
    reference = load_reference(model_dirs["tied"])
    once = make_batch(8, k=K, seed=5, vocab=reference.config.vocab_size)
    copies = {k: v.repeat_interleave(COPIES, dim=0) for k, v in once.items()}  # prompt-major
    loss_fn = DistillationLossFn(params=TopkKLParams(kl_type="forward"), implementation="torch")
    with running_policy(cfg, 2, name="global_batch") as policy:
        metrics = policy.train(once, loss_fn, global_batch_size=8 // COPIES)
        weights = policy.full_weights()
    ref_losses, ref_norms, ref_params, _ = reference_train(
        reference, copies, loss_fn, cfg, cfg.train_global_batch_size
    )
    assert len(metrics["loss"]) == len(ref_losses) == 2
    close = {"rtol": 1e-4, "atol": 0.0}
    torch.testing.assert_close(torch.tensor(metrics["loss"]), torch.tensor(ref_losses), **close)
    torch.testing.assert_close(torch.tensor(metrics["grad_norm"]), torch.tensor(ref_norms), **close)
    for name, ref in ref_params.items():
        err = (weights[name] - ref.detach()).abs().max()
        assert err < 1e-4, f"{name} differs by {err:.3g}"
