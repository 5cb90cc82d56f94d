"""The DTensor engine of one float32 process without FSDP computes the FSDP-wrapped engine's
steps: the same losses, gradient norms and weights after training (in this process, gloo at
world size 1, no Ray)."""

import pytest
import torch
from tiny_policies import make_batch, policy_config
from torch.distributed.tensor import Replicate, distribute_tensor

import nemo_opd.policy.engines.dtensor as dtensor
from nemo_opd.config import OptimizerConfig
from nemo_opd.data.batching import TensorBatch
from nemo_opd.distributed.context_parallel import AttentionLayout
from nemo_opd.distributed.parallel_dims import ParallelDims
from nemo_opd.losses import DistillationLossFn, TopkKLParams
from nemo_opd.policy.engines.dtensor import DTensorEngine, needs_fsdp
from nemo_opd.policy.optim import build_optimizer


def test_only_one_float32_process_goes_unwrapped():
    one, two = ParallelDims(world_size=1), ParallelDims(world_size=2)
    assert not needs_fsdp(one, torch.float32, cpu_offload=False)
    assert needs_fsdp(one, torch.bfloat16, cpu_offload=False)  # FSDP keeps fp32 masters
    assert needs_fsdp(one, torch.float32, cpu_offload=True)
    assert needs_fsdp(two, torch.float32, cpu_offload=False)
    # a frozen model held in its precision: nothing to cast, in one process
    assert not needs_fsdp(one, torch.bfloat16, cpu_offload=False, storage_dtype=torch.bfloat16)
    assert needs_fsdp(two, torch.bfloat16, cpu_offload=False, storage_dtype=torch.bfloat16)


def test_unwrapped_step_equals_the_fsdp_step(world1, model_dirs, monkeypatch):
    cfg = policy_config(model_dirs["tied"], train_micro_batch_size=2)
    engines = {}
    for wrapped in (True, False):
        monkeypatch.setattr(dtensor, "needs_fsdp", lambda *args, w=wrapped: w)
        engines[wrapped] = DTensorEngine(cfg, world1, torch.device("cpu"), total_steps=10)
    assert isinstance(engines[True].model, dtensor.FSDPModule)
    assert not isinstance(engines[False].model, dtensor.FSDPModule)
    loss_fn = DistillationLossFn(params=TopkKLParams(kl_type="reverse"))
    histories = {}
    for seed in (0, 1):
        batch = TensorBatch(make_batch(8, seed=seed))
        for wrapped, engine in engines.items():
            history = engine.train(batch, loss_fn, global_batch_size=4)
            histories.setdefault(wrapped, []).append(history)
    for fsdp, plain in zip(histories[True], histories[False], strict=True):
        for name in ("loss", "grad_norm"):
            assert plain[name] == pytest.approx(fsdp[name], rel=1e-5)
    fsdp_weights = engines[True].gather_weights()
    plain_weights = engines[False].gather_weights()
    assert fsdp_weights.keys() == plain_weights.keys()
    for name, weight in fsdp_weights.items():
        torch.testing.assert_close(plain_weights[name], weight, rtol=1e-5, atol=1e-6)
    # A gathered copy outlives the next step unchanged: it is never the live parameter.
    live = dict(engines[False].model.named_parameters())
    for name, weight in plain_weights.items():
        assert weight.data_ptr() != live[name].data_ptr()


def test_unwrapped_lora_adapters_are_gathered_as_copies(world1, model_dirs):
    lora = {"lora__enabled": True, "lora__rank": 2, "lora__target_modules": ["q_proj"]}
    engine = DTensorEngine(policy_config(model_dirs["tied"], **lora), world1, torch.device("cpu"))
    assert not isinstance(engine.model, dtensor.FSDPModule)
    live = {p.data_ptr() for p in engine.model.parameters()}
    adapters = engine.gather_weights()
    assert adapters and all(a.data_ptr() not in live for a in adapters.values())


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_forward_hidden_gives_the_head_one_contiguous_position(world1, model_dirs, precision):
    # The head's input is [b, 1, H] and contiguous: a strided [:, -1:] view made the product a
    # batched matmul over a copy of the whole head per row (17 s per microbatch at Qwen3's
    # vocabulary in bfloat16 on CPU). The hidden states are the body's, as without the hook.
    cfg = policy_config(model_dirs["tied"], precision=precision)
    engine = DTensorEngine(cfg, world1, torch.device("cpu"), total_steps=10)
    seen = []
    head = engine.model.get_output_embeddings()
    handle = head.register_forward_hook(lambda module, args, output: seen.append(args[0]))
    batch = make_batch(3, teacher=False)
    ids = batch["input_ids"]
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    layout = AttentionLayout(segment_ids=torch.ones_like(ids))
    try:
        hidden = engine.forward_hidden(ids, positions, layout)
    finally:
        handle.remove()
    (head_input,) = seen
    assert head_input.shape == (3, 1, hidden.shape[-1]) and head_input.is_contiguous()
    torch.testing.assert_close(head_input[:, 0], hidden[:, -1])
    body = engine.model.get_decoder()(input_ids=ids, position_ids=positions)
    expected = body.last_hidden_state
    expected = expected.to_local() if isinstance(expected, dtensor.DTensor) else expected
    assert hidden.dtype == dtensor.DTYPES[precision]
    torch.testing.assert_close(hidden, expected)


def test_adamw_fuses_one_mesh_and_loops_over_several(world1):
    def on(mesh_name: str) -> torch.nn.Parameter:
        mesh = world1.submesh(mesh_name)
        return torch.nn.Parameter(distribute_tensor(torch.ones(4), mesh, [Replicate()]))

    cfg = OptimizerConfig(lr=1e-2)
    assert build_optimizer([on("dp_cp"), on("dp_cp")], cfg).defaults["fused"]
    several = build_optimizer([on("dp_cp"), on("tp")], cfg)
    assert not several.defaults["fused"] and several.defaults["foreach"] is False
    mixed = build_optimizer([on("dp_cp"), torch.nn.Parameter(torch.ones(2))], cfg)
    assert not mixed.defaults["fused"]


def test_a_frozen_model_holds_its_precision_and_scores_as_the_float32_masters_do(
    world1, model_dirs
):
    """A teacher in bfloat16 holds bf16 weights (half the memory of float32 masters) in a plain
    module (one process: nothing to shard or cast), and its scores are exactly those of the
    same model held in float32 and cast by FSDP's mixed precision at every forward (as a
    trained model is): the one rounding, made once."""
    cfg = policy_config(model_dirs["untied"], precision="bfloat16")
    frozen = DTensorEngine(cfg, world1, torch.device("cpu"), with_optimizer=False)
    masters = DTensorEngine(cfg, world1, torch.device("cpu"), total_steps=10)
    assert {p.dtype for p in frozen.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in masters.model.parameters()} == {torch.float32}
    assert not isinstance(frozen.model, dtensor.FSDPModule)  # no gather, no per-forward copy
    assert isinstance(masters.model, dtensor.FSDPModule)
    batch = TensorBatch(make_batch(4, teacher=False))
    masters.set_train_mode(False)
    for mine, theirs in zip(
        frozen.get_topk_logits(batch, 4, 1.0), masters.get_topk_logits(batch, 4, 1.0), strict=True
    ):
        assert torch.equal(mine, theirs)


def test_varlen_packed_attention_is_refused_where_it_cannot_run(world1, model_dirs):
    """On the CPU (or in float32) torch's varlen flash attention cannot run: asked for, the
    engine refuses at its start, naming the key and what to set."""
    cfg = policy_config(model_dirs["tied"], dtensor_cfg__packed_attention="varlen")
    with pytest.raises(ValueError, match=r"packed_attention=varlen .* needs CUDA.*=auto"):
        DTensorEngine(cfg, world1, torch.device("cpu"), total_steps=10)


def test_packed_rows_through_the_varlen_path_train_as_per_segment(world1, model_dirs, monkeypatch):
    """Packed microbatches (several sequences per row) attend in one varlen call per layer
    (the kernel's documented semantics on the CPU: tests/varlen_reference.py; the kernel itself
    on CUDA: test_segment_attention.py), and two training steps give the per-segment path's
    losses, gradient norms and weights."""
    import torch.nn.attention.varlen as torch_varlen
    from varlen_reference import reference_varlen

    import nemo_opd.distributed.context_parallel as context_parallel

    calls = []

    def counted(*args, **kwargs):
        calls.append(args[3].numel() - 1)  # sequences in the call
        return reference_varlen(*args, **kwargs)

    monkeypatch.setattr(torch_varlen, "varlen_attn", counted)
    monkeypatch.setattr(context_parallel, "use_varlen", lambda choice, *_: choice == "auto")
    packing = {
        "sequence_packing__enabled": True,
        "sequence_packing__train_mb_tokens": 48,
        "sequence_packing__logprob_mb_tokens": 48,
        "sequence_packing__sequence_length_round": 4,
    }
    histories, weights = {}, {}
    for choice in ("per_segment", "auto"):
        cfg = policy_config(model_dirs["tied"], dtensor_cfg__packed_attention=choice, **packing)
        engine = DTensorEngine(cfg, world1, torch.device("cpu"), total_steps=10)
        loss_fn = DistillationLossFn(params=TopkKLParams(kl_type="reverse"))
        histories[choice] = [
            engine.train(TensorBatch(make_batch(8, seed=seed)), loss_fn, global_batch_size=4)
            for seed in (0, 1)
        ]
        weights[choice] = engine.gather_weights()
    assert calls and max(calls) > 1, "the varlen path never saw a packed row"
    for plain, varlen in zip(histories["per_segment"], histories["auto"], strict=True):
        for name in ("loss", "grad_norm"):
            assert varlen[name] == pytest.approx(plain[name], rel=1e-5)
    # The reference attends in float64: fp32 noise apart, AdamW (lr 1e-3) moves each element by
    # about lr in the gradient's direction, so a wrong step would differ by ~1e-3.
    for name, weight in weights["per_segment"].items():
        torch.testing.assert_close(weights["auto"][name], weight, rtol=1e-5, atol=1e-5)
