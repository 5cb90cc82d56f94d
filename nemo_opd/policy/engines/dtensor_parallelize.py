"""apply_* functions that parallelize a Hugging Face causal LM in place (DTensor backend).

Order (as in torchtitan, after padding the vocabulary): vocabulary padding -> tensor parallel
-> activation checkpointing -> FSDP. Context parallelism needs no module changes: the
attention function gathers keys and values (nemo_opd.distributed.context_parallel).
"""

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from nemo_opd.policy.engines.lora import lora_block_plan
from nemo_opd.policy.engines.vocab_padding import resize_vocab_rows

TP_REPLICATED_SUFFIXES = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")
"""Parameters applied per attention head: under TP each rank sees only its heads, so their
gradients are partial and must be summed over the tp group (see tp_replicated_parameters)."""


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The transformer blocks of a Qwen3/Llama-style causal LM."""
    return model.model.layers


def apply_vocab_padding(model: torch.nn.Module, rows: int) -> None:
    """Give the embedding and lm_head `rows` rows (and the lm_head's bias, where it has one,
    `rows` entries), the new ones zero (one shared parameter when they are tied); the logits
    then have `rows` columns (see vocab_padding.py)."""
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    if embed.weight.shape[0] == rows:
        return
    embed.weight = torch.nn.Parameter(resize_vocab_rows(embed.weight.detach(), rows))
    embed.num_embeddings = rows
    if model.config.tie_word_embeddings:
        head.weight = embed.weight
    else:
        head.weight = torch.nn.Parameter(resize_vocab_rows(head.weight.detach(), rows))
    if head.bias is not None:
        head.bias = torch.nn.Parameter(resize_vocab_rows(head.bias.detach(), rows))
    head.out_features = rows


def apply_tensor_parallel(model: torch.nn.Module, tp_mesh: DeviceMesh) -> None:
    """Megatron-style TP: q/k/v and gate/up column-parallel, o and down row-parallel, the
    embedding and lm_head split along the (padded) vocabulary; logits stay vocab-sharded
    [.., V_pad / tp]. LoRA adapters follow their projection (lora.lora_block_plan)."""
    config = model.config
    tp = tp_mesh.size()
    for name, size in (
        ("num_attention_heads", config.num_attention_heads),
        ("num_key_value_heads", config.num_key_value_heads),
    ):
        if size % tp:
            raise ValueError(f"tensor_parallel_size {tp} must divide the model's {name} ({size})")
    rows = model.get_input_embeddings().weight.shape[0]
    if rows % tp:
        raise ValueError(f"{rows} embedding rows do not divide by {tp}: apply_vocab_padding first")
    block_plan = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }
    for block in decoder_layers(model):  # projections peft wrapped get their adapters' layout
        parallelize_module(block, tp_mesh, lora_block_plan(block, block_plan))
    parallelize_module(
        model,
        tp_mesh,
        {
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=True),
        },
    )
    if config.tie_word_embeddings:
        # Both sides shard the [V, H] weight along dim 0 the same way: share one DTensor.
        model.lm_head.weight = model.model.embed_tokens.weight


def apply_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in backward (non-reentrant)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def apply_fsdp(
    model: torch.nn.Module,
    mesh: DeviceMesh,
    param_dtype: torch.dtype,
    cpu_offload: bool = False,
) -> None:
    """FSDP2 over `mesh`: one group per decoder layer plus the root (embeddings, norm, head).

    Gradients are reduced in fp32 and summed, not averaged: the loss is already normalized by
    the global token count. cpu_offload keeps the sharded parameters, gradients
    and optimizer state in host memory (FSDP's CPUOffloadPolicy; only meaningful on CUDA).
    """
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy() if cpu_offload else OffloadPolicy()
    sharded = [*decoder_layers(model), model]
    for module in sharded:
        fully_shard(module, mesh=mesh, mp_policy=policy, offload_policy=offload)
    for module in sharded:  # each call sets only that module's own groups
        # Plain SUM reductions (gloo has no PREMUL_SUM, which a custom factor would use).
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)


def tp_replicated_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Parameters that are replicated over tp but see only the local heads' activations."""
    return [p for n, p in model.named_parameters() if n.endswith(TP_REPLICATED_SUFFIXES)]
