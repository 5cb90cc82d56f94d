"""Build a megatron-core GPTModel from a Hugging Face config and run its forward to logits.

Supported families: Qwen3 and Llama (RMSNorm, SwiGLU, grouped-query attention, RoPE, Qwen3's
per-head q/k RMSNorm, tied or untied embeddings). The model uses megatron-core's local layer
spec (ColumnParallelLinear / RowParallelLinear, torch RMSNorm) with two replacements that make
it match the Hugging Face model position for position:

- Core attention is `SegmentCausalAttention`: causal attention within segments (sequence
  packing) that all-gathers keys and values over the context-parallel group, the same
  algorithm as the DTensor engine (nemo_opd/distributed/context_parallel.py). Megatron's own
  context parallelism and packed-sequence attention need Transformer Engine (no CPU path).
- RoPE angles are computed from the position ids with Hugging Face's inverse frequencies
  (`rope_frequencies`), so packed rows (positions restart per sequence), context-parallel
  shards (positions start at the shard offset) and scaled RoPE (llama3, linear) are exact.
  GPTModel's own rotary module derives positions from the sequence length alone.

Megatron is initialized with context_parallel_size=1: context parallelism lives entirely in the
attention above, so Megatron's data-parallel group is this engine's dp x cp group.
"""

import torch
import torch.nn.functional as F
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from transformers import PretrainedConfig

from nemo_opd.distributed.context_parallel import gather_sequence
from nemo_opd.models.output_head import output_head_of

SUPPORTED_MODEL_TYPES = ("qwen3", "llama")
# RoPE types whose angles are position x inverse frequency with no extra attention scaling.
STATIC_ROPE_TYPES = ("default", "linear", "llama3")


def check_supported(hf_config: PretrainedConfig) -> None:
    """Raise for Hugging Face configs this builder would not reproduce exactly."""
    if hf_config.model_type not in SUPPORTED_MODEL_TYPES:
        raise NotImplementedError(
            f"Megatron engine: model_type {hf_config.model_type!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if not output_head_of(hf_config).is_plain:  # GPTModel's output layer is h W^T only
        raise NotImplementedError(
            f"Megatron engine: the output head of {hf_config.model_type!r} adds a bias, scale "
            "or soft-cap to h W^T, which it does not apply; use the DTensor backend"
        )
    if hf_config.hidden_act != "silu":
        raise NotImplementedError(f"Megatron engine: hidden_act {hf_config.hidden_act!r}")
    for flag in ("attention_bias", "mlp_bias"):
        if getattr(hf_config, flag, False):
            raise NotImplementedError(f"Megatron engine: {flag}=True is not supported")
    rope_type = hf_config.rope_parameters.get("rope_type", "default")
    if rope_type not in STATIC_ROPE_TYPES:
        raise NotImplementedError(f"Megatron engine: rope_type {rope_type!r} is not supported")


def head_dim(hf_config: PretrainedConfig) -> int:
    """Per-head width (Llama configs may omit head_dim)."""
    explicit = getattr(hf_config, "head_dim", None)
    return explicit or hf_config.hidden_size // hf_config.num_attention_heads


def transformer_config(
    hf_config: PretrainedConfig,
    tp: int,
    *,
    use_cpu_initialization: bool,
    activation_checkpointing: bool = False,
) -> TransformerConfig:
    """megatron-core TransformerConfig equivalent to a Qwen3/Llama Hugging Face config.

    Parameters are fp32 (master weights; bf16 runs use autocast in the forward). Every fused
    kernel is off: they need CUDA extensions, and the unfused paths are what Hugging Face
    computes. Weights are not initialized here (they are loaded from the checkpoint).
    """
    recompute = (
        {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
        if activation_checkpointing
        else {}
    )
    return TransformerConfig(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=hf_config.num_key_value_heads,
        kv_channels=head_dim(hf_config),
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        qk_layernorm=hf_config.model_type == "qwen3",
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=getattr(hf_config, "attention_dropout", 0.0),
        tensor_model_parallel_size=tp,
        params_dtype=torch.float32,
        use_cpu_initialization=use_cpu_initialization,
        perform_initialization=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        calculate_per_token_loss=True,  # DDP sums gradients: the loss is globally normalized
        **recompute,
    )


class SegmentCausalAttention(MegatronModule):
    """Megatron core attention: causal within segments, context parallel by gathering K/V.

    Built by megatron's SelfAttention through the layer spec (same constructor arguments as
    megatron's DotProductAttention, plus cp_group from the spec's params).

    forward(query [s_local, b, h, d], key/value [s_local, b, h_kv, d], attention_mask) with
    attention_mask a bool [b, 1, s_local, S] that is True where a query may see a key (S: the
    full row, all context-parallel shards); returns [s_local, b, h * d].
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection=None,
        cp_group: torch.distributed.ProcessGroup | None = None,
    ) -> None:
        super().__init__(config=config)
        self.cp_group = cp_group
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        # None lets scaled_dot_product_attention use 1 / sqrt(head_dim), as Hugging Face does.
        self.softmax_scale = softmax_scale if softmax_scale is not None else config.softmax_scale

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        if attention_bias is not None or packed_seq_params is not None:
            raise NotImplementedError("SegmentCausalAttention takes its layout from the mask")
        # [s, b, h, d] -> [b, h, s, d]
        query, key, value = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        key = gather_sequence(key, self.cp_group)
        value = gather_sequence(value, self.cp_group)
        repeats = query.shape[1] // key.shape[1]
        if repeats > 1:
            key = key.repeat_interleave(repeats, dim=1)
            value = value.repeat_interleave(repeats, dim=1)
        out = F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attention_mask,
            dropout_p=self.dropout if self.training else 0.0,
            scale=self.softmax_scale,
        )
        s, b = out.shape[2], out.shape[0]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)


def layer_spec(qk_layernorm: bool, cp_group: torch.distributed.ProcessGroup | None) -> ModuleSpec:
    """megatron-core's local GPT layer spec with SegmentCausalAttention as core attention."""
    spec = get_gpt_layer_local_spec(qk_layernorm=qk_layernorm, normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = ModuleSpec(
        module=SegmentCausalAttention, params={"cp_group": cp_group}
    )
    return spec


def build_gpt_model(
    hf_config: PretrainedConfig,
    config: TransformerConfig,
    cp_group: torch.distributed.ProcessGroup | None,
    vocab_size: int,
) -> GPTModel:
    """An uninitialized GPTModel with the architecture of `hf_config` (load weights next).

    Megatron's model-parallel state must be initialized first (tensor parallel size as in
    `config`). `vocab_size` is the padded vocabulary (vocab_padding.py): it must divide by the
    tensor-parallel size.
    """
    check_supported(hf_config)
    tp = config.tensor_model_parallel_size
    if vocab_size % tp:
        raise ValueError(
            f"vocab_size {vocab_size} must be divisible by the tensor-parallel size {tp}"
        )
    return GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(config.qk_layernorm, cp_group),
        vocab_size=vocab_size,
        max_sequence_length=hf_config.max_position_embeddings,
        parallel_output=True,
        share_embeddings_and_output_weights=hf_config.tie_word_embeddings,
        # RoPE angles come from rope_frequencies (see the module docstring).
        position_embedding_type="none",
    )


def rope_frequencies(hf_config: PretrainedConfig) -> torch.Tensor:
    """Hugging Face's RoPE inverse frequencies [head_dim / 2] fp32 for static rope types."""
    params = hf_config.rope_parameters
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        dim = head_dim(hf_config)
        exponent = torch.arange(0, dim, 2, dtype=torch.float32) / dim
        return 1.0 / (params["rope_theta"] ** exponent)
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config)
    if scaling != 1.0:
        raise NotImplementedError(f"rope_type {rope_type!r} scales attention by {scaling}")
    return inv_freq.float()


def rope_angles(position_ids: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Megatron rotary input [s, b, 1, head_dim] (angles, fp32) from position ids [b, s]."""
    angles = position_ids.unsqueeze(-1).float() * inv_freq.to(position_ids.device)
    angles = torch.cat((angles, angles), dim=-1)  # non-interleaved halves, as rotate_half
    return angles.transpose(0, 1).unsqueeze(2)


def gpt_logits(
    model: GPTModel,
    input_ids: torch.Tensor,
    rotary: torch.Tensor,
    visible: torch.Tensor,
) -> torch.Tensor:
    """Vocab-parallel logits [b, s_local, V_pad / tp] of a GPTModel (V_pad: its vocabulary).

    Args:
        input_ids: [b, s_local] this rank's positions.
        rotary: [s_local, b, 1, head_dim] from rope_angles.
        visible: [b, 1, s_local, S] bool attention mask (True: the key is visible).
    """
    hidden = _gpt_body(model, input_ids, rotary, visible)
    weight = (
        model.shared_embedding_or_output_weight()
        if model.share_embeddings_and_output_weights
        else None
    )
    logits, _ = model.output_layer(hidden, weight=weight)
    return logits.transpose(0, 1)


def gpt_hidden(
    model: GPTModel, input_ids: torch.Tensor, rotary: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """The final hidden states [b, s_local, H] of a GPTModel (the decoder's final norm applied;
    the output layer left out). Arguments as gpt_logits."""
    return _gpt_body(model, input_ids, rotary, visible).transpose(0, 1)


def gpt_output_weight(model: GPTModel) -> torch.Tensor:
    """This rank's rows of the output layer [V_pad / tp, H] (the embedding's when tied)."""
    if model.share_embeddings_and_output_weights:
        return model.shared_embedding_or_output_weight()
    return model.output_layer.weight


def _gpt_body(
    model: GPTModel, input_ids: torch.Tensor, rotary: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """Embedding and decoder: hidden states [s_local, b, H]."""
    hidden = model.embedding(input_ids=input_ids, position_ids=None)  # [s, b, hidden]
    return model.decoder(hidden_states=hidden, attention_mask=visible, rotary_pos_emb=rotary)
