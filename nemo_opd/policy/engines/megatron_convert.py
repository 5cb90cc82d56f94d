"""Hugging Face <-> megatron-core weight conversion for Qwen3/Llama, with tensor parallelism.

Megatron names follow megatron-core's local GPT layer spec. Each Megatron parameter is made
from one or more Hugging Face tensors by one of five rules ("kind"):

    replicated  norms: the same tensor on every tensor-parallel rank
    rows        embedding and lm_head, padded with zero rows to the padded vocabulary
                (vocab_padding.py): rank r holds rows [r V_pad/tp, (r+1) V_pad/tp); the
                padding is stripped on the way back
    cols        o_proj and down_proj (row-parallel linears): rank r holds input columns
    qkv         linear_qkv: q, k and v interleaved per query group,
                [g0: q heads of g0, k0, v0 | g1: ... ] (rows), groups split over ranks
    fc1         linear_fc1: rank r holds [gate rows of r; up rows of r] (SwiGLU's chunk(2))

The rules are linear re-arrangements (plus zero padding), so they apply unchanged to anything
shaped like the weights (Adam's moment estimates included) and round-trip exactly.
"""

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch

from nemo_opd.policy.engines.vocab_padding import (
    VOCAB_PAD_MULTIPLE,
    padded_vocab_size,
    resize_vocab_rows,
)

Kind = str  # "replicated" | "rows" | "cols" | "qkv" | "fc1"


@dataclass(frozen=True)
class GPTShape:
    """What the conversion needs to know about the architecture.

    Attributes:
        num_layers: decoder layers.
        num_heads, num_kv_heads, head_dim: attention heads (query, key/value) and their width.
        tied: lm_head shares the embedding (no output_layer.weight / lm_head.weight of its own).
        qk_norm: Qwen3-style per-head q_norm / k_norm.
        vocab_size: the Hugging Face model's vocabulary (rows of its embedding and lm_head).
        padded_vocab_size: rows of the Megatron embedding and output layer.
    """

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tied: bool
    qk_norm: bool
    vocab_size: int
    padded_vocab_size: int

    @classmethod
    def from_hf_config(cls, config, tp: int = 1, multiple: int = VOCAB_PAD_MULTIPLE) -> "GPTShape":
        """The shape of the Megatron model of `config` at tensor-parallel size `tp`, its
        vocabulary padded to a multiple of `multiple` x tp."""
        head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )
        return cls(
            num_layers=config.num_hidden_layers,
            num_heads=config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            head_dim=head_dim,
            tied=bool(config.tie_word_embeddings),
            qk_norm=config.model_type == "qwen3",
            vocab_size=config.vocab_size,
            padded_vocab_size=padded_vocab_size(config.vocab_size, tp, multiple),
        )


@dataclass(frozen=True)
class Rule:
    """One Megatron parameter: how it is built from its Hugging Face tensors."""

    megatron_name: str
    kind: Kind
    hf_names: tuple[str, ...]

    @property
    def sharded(self) -> bool:
        """Split over tensor-parallel ranks (its gradient norm is summed over them)."""
        return self.kind != "replicated"

    @property
    def partition_dim(self) -> int | None:
        """The dimension split over tensor-parallel ranks (None when replicated)."""
        if not self.sharded:
            return None
        return 1 if self.kind == "cols" else 0


def conversion_rules(shape: GPTShape) -> list[Rule]:
    """Every Megatron parameter of the model, in a fixed order, with its rule."""
    rules = [Rule("embedding.word_embeddings.weight", "rows", ("model.embed_tokens.weight",))]
    for i in range(shape.num_layers):
        mc, hf = f"decoder.layers.{i}.", f"model.layers.{i}."
        attn = hf + "self_attn."
        rules += [
            Rule(mc + "input_layernorm.weight", "replicated", (hf + "input_layernorm.weight",)),
            Rule(
                mc + "self_attention.linear_qkv.weight",
                "qkv",
                (attn + "q_proj.weight", attn + "k_proj.weight", attn + "v_proj.weight"),
            ),
        ]
        if shape.qk_norm:
            rules += [
                Rule(
                    mc + "self_attention.q_layernorm.weight",
                    "replicated",
                    (attn + "q_norm.weight",),
                ),
                Rule(
                    mc + "self_attention.k_layernorm.weight",
                    "replicated",
                    (attn + "k_norm.weight",),
                ),
            ]
        rules += [
            Rule(mc + "self_attention.linear_proj.weight", "cols", (attn + "o_proj.weight",)),
            Rule(
                mc + "pre_mlp_layernorm.weight",
                "replicated",
                (hf + "post_attention_layernorm.weight",),
            ),
            Rule(
                mc + "mlp.linear_fc1.weight",
                "fc1",
                (hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight"),
            ),
            Rule(mc + "mlp.linear_fc2.weight", "cols", (hf + "mlp.down_proj.weight",)),
        ]
    rules.append(Rule("decoder.final_layernorm.weight", "replicated", ("model.norm.weight",)))
    if not shape.tied:
        rules.append(Rule("output_layer.weight", "rows", ("lm_head.weight",)))
    return rules


# ------------------------------------------------------------------ one tensor, both directions


def _group_rows(shape: GPTShape) -> tuple[int, int]:
    """(query rows, key/value rows) of one query group in linear_qkv."""
    return shape.num_heads // shape.num_kv_heads * shape.head_dim, shape.head_dim


def to_megatron(
    rule: Rule, hf: list[torch.Tensor], shape: GPTShape, tp_rank: int, tp_size: int
) -> torch.Tensor:
    """This tensor-parallel rank's shard of one Megatron parameter from full HF tensors."""
    if rule.kind == "replicated":
        return hf[0].clone()
    if rule.kind == "rows":
        if shape.padded_vocab_size % tp_size:
            raise ValueError(
                f"the padded vocabulary ({shape.padded_vocab_size}) does not divide by {tp_size}"
            )
        padded = resize_vocab_rows(hf[0], shape.padded_vocab_size)
        return padded.chunk(tp_size, dim=0)[tp_rank].clone()
    if rule.kind == "cols":
        return hf[0].chunk(tp_size, dim=1)[tp_rank].clone()
    if rule.kind == "fc1":
        gate, up = (t.chunk(tp_size, dim=0)[tp_rank] for t in hf)
        return torch.cat([gate, up], dim=0)
    if rule.kind == "qkv":
        q_rows, kv_rows = _group_rows(shape)
        groups = shape.num_kv_heads
        q, k, v = hf
        rest = q.shape[1:]
        fused = torch.cat(
            [
                q.reshape(groups, q_rows, *rest),
                k.reshape(groups, kv_rows, *rest),
                v.reshape(groups, kv_rows, *rest),
            ],
            dim=1,
        )  # [groups, q_rows + 2 kv_rows, ...]
        return fused.chunk(tp_size, dim=0)[tp_rank].reshape(-1, *rest).clone()
    raise ValueError(f"unknown conversion kind {rule.kind!r}")


def to_hf(rule: Rule, shards: list[torch.Tensor], shape: GPTShape) -> list[torch.Tensor]:
    """Full HF tensors (in rule.hf_names order) from every tensor-parallel rank's shard."""
    if rule.kind == "replicated":
        return [shards[0].clone()]
    if rule.kind == "rows":
        return [resize_vocab_rows(torch.cat(shards, dim=0), shape.vocab_size)]
    if rule.kind == "cols":
        return [torch.cat(shards, dim=1)]
    if rule.kind == "fc1":
        halves = [s.chunk(2, dim=0) for s in shards]
        return [torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])]
    if rule.kind == "qkv":
        q_rows, kv_rows = _group_rows(shape)
        full = torch.cat(shards, dim=0)
        rest = full.shape[1:]
        fused = full.reshape(shape.num_kv_heads, q_rows + 2 * kv_rows, *rest)
        q, k, v = fused.split([q_rows, kv_rows, kv_rows], dim=1)
        return [t.reshape(-1, *rest).clone() for t in (q, k, v)]
    raise ValueError(f"unknown conversion kind {rule.kind!r}")


# ------------------------------------------------------------------ whole state dicts


def hf_to_megatron(
    get_hf: Callable[[str], torch.Tensor] | Mapping[str, torch.Tensor],
    shape: GPTShape,
    tp_rank: int = 0,
    tp_size: int = 1,
) -> dict[str, torch.Tensor]:
    """{megatron name: this rank's shard} from HF tensors (a mapping or a name -> tensor
    function, so a checkpoint can be read one tensor at a time)."""
    get = get_hf.__getitem__ if isinstance(get_hf, Mapping) else get_hf
    return {
        rule.megatron_name: to_megatron(
            rule, [get(n) for n in rule.hf_names], shape, tp_rank, tp_size
        )
        for rule in conversion_rules(shape)
    }


def megatron_to_hf(
    shards: list[Mapping[str, torch.Tensor]], shape: GPTShape
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) from the Megatron state dicts of every tensor-parallel rank."""
    for rule in conversion_rules(shape):
        tensors = to_hf(rule, [s[rule.megatron_name] for s in shards], shape)
        yield from zip(rule.hf_names, tensors, strict=True)
