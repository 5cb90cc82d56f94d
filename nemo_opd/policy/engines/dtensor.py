"""DTensorEngine: Hugging Face causal LMs with FSDP2, tensor and context parallelism.

Build steps: register the segment-causal attention -> load the model with from_pretrained ->
(with policy.lora: peft's adapters injected, lora.py) -> pad the vocabulary rows of the
embedding and lm_head (vocab_padding.py) -> apply tensor parallel over "tp" -> activation
checkpointing -> FSDP2 over "dp_cp" -> optimizer and scheduler (with LoRA: over the adapters
only, the rest frozen). A model that trains holds float32 master weights; a frozen one (a
teacher) holds its weights in its precision, which FSDP's mixed precision computes in anyway.
One process training in float32 (world size 1, no CPU offload) skips FSDP: there is nothing to
shard, gather or reduce, and its mixed-precision cast would be the identity, so the plain
module computes the same step without FSDP's and DTensor's per-layer hooks and dispatch
(docs/benchmarks.md); so does a frozen model of one process held in its precision. Every other
layout, and a lone process training in bf16 (whose fp32 master weights FSDP keeps), is
wrapped; the rest of the engine serves both. Weights, checkpoints and optimizer state leave
the engine with the real vocabulary's rows and are padded
again when loaded.

A LoRA student's refit weights and export are merged (W + s B A, computed per weight without
touching the base copy); its checkpoints hold the adapters and their optimizer state only.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from nemo_opd.config import PolicyConfig
from nemo_opd.distributed.context_parallel import (
    LAYOUT_KWARG,
    AttentionLayout,
    register_attention,
    segment_runs,
    varlen_runs,
)
from nemo_opd.distributed.grad_norm import all_reduce_grads, clip_grad_norm
from nemo_opd.distributed.parallel_dims import ParallelDims
from nemo_opd.policy.engines.base import Engine
from nemo_opd.policy.engines.dtensor_parallelize import (
    apply_activation_checkpointing,
    apply_fsdp,
    apply_tensor_parallel,
    apply_vocab_padding,
    tp_replicated_parameters,
)
from nemo_opd.policy.engines.lora import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
    adapter_pairs,
    hf_name,
    inject_lora,
    is_adapter,
    load_adapter,
    lora_summary,
    merge_state,
    merged_weight,
    peft_name,
    save_adapter,
    train_only_adapters,
)
from nemo_opd.policy.engines.training_state import (
    DTYPES,
    WEIGHTS_FILE,
    move_training_state,
    write_weights,
)
from nemo_opd.policy.engines.vocab_padding import (
    VOCAB_WEIGHTS,
    resize_vocab_optimizer_state,
    resize_vocab_weights,
)
from nemo_opd.policy.optim import build_training_optimizer
from nemo_opd.utils.checkpoint import atomic_directory

FULL = StateDictOptions(full_state_dict=True)
FULL_ON_CPU = StateDictOptions(full_state_dict=True, cpu_offload=True)
FULL_PARTIAL = StateDictOptions(full_state_dict=True, strict=False)  # a LoRA student's adapters
ADAPTER_DIR = "adapter"
"""The peft adapter's folder inside a LoRA student's export."""


class DTensorEngine(Engine):
    """The DTensor backend (see the module docstring).

    Args:
        cfg, dims, device, with_optimizer: as Engine.
        total_steps: optimizer steps of the whole run (for decaying schedules without
            scheduler.decay_steps).
    """

    def __init__(
        self,
        cfg: PolicyConfig,
        dims: ParallelDims,
        device: torch.device,
        with_optimizer: bool = True,
        total_steps: int | None = None,
    ) -> None:
        super().__init__(cfg, dims, device, with_optimizer)
        self.lora = cfg.lora if cfg.lora.enabled else None
        self.model = self._build_model()
        self._lora_pairs = adapter_pairs(self.model) if self.lora else {}
        self._tp_replicated = tp_replicated_parameters(self.model) if dims.tp > 1 else []
        if with_optimizer:
            trainable = [p for p in self.model.parameters() if p.requires_grad]
            optimizer = cfg.optimizer
            if self.lora and self.lora.learning_rate is not None:
                optimizer = optimizer.model_copy(update={"lr": self.lora.learning_rate})
            self.optimizer, self.scheduler = build_training_optimizer(
                trainable, optimizer, cfg.scheduler, total_steps
            )
        if self.lora and dist.get_rank() == 0:
            print(lora_summary(self.model, self.lora), flush=True)

    def _build_model(self) -> torch.nn.Module:
        if self.cfg.dtensor_cfg.sequence_parallel:
            raise NotImplementedError("dtensor_cfg.sequence_parallel is not implemented yet")
        self._check_packed_attention()
        attention = register_attention()
        model = AutoModelForCausalLM.from_pretrained(
            self.model_dir,
            dtype=self._storage_dtype(),
            attn_implementation=attention,
        )
        if self.lora:
            inject_lora(model, self.lora)
        model.to(self.device)
        apply_vocab_padding(model, self.padded_vocab_size)
        if self.dims.tp > 1:
            apply_tensor_parallel(model, self.dims.submesh("tp"))
        if self.cfg.dtensor_cfg.activation_checkpointing:
            apply_activation_checkpointing(model)
        cpu_offload = self.cfg.dtensor_cfg.cpu_offload and self.device.type == "cuda"
        if needs_fsdp(self.dims, DTYPES[self.cfg.precision], cpu_offload, self._storage_dtype()):
            apply_fsdp(
                model,
                self.dims.submesh("dp_cp"),
                DTYPES[self.cfg.precision],
                cpu_offload=cpu_offload,
            )
        if not self.with_optimizer:
            model.requires_grad_(False)
        elif self.lora:
            train_only_adapters(model)
        return model

    def _check_packed_attention(self) -> None:
        """dtensor_cfg.packed_attention varlen refused where torch's varlen flash attention
        cannot run: off CUDA, or computing in float32."""
        asked = self.cfg.dtensor_cfg.packed_attention == "varlen"
        if not asked or varlen_runs(self.device, DTYPES[self.cfg.precision]):
            return
        raise ValueError(
            "policy.dtensor_cfg.packed_attention=varlen runs torch's variable-length flash "
            f"attention, which needs CUDA and bfloat16 or float16; this engine computes in "
            f"{self.cfg.precision} on {self.device.type}: set policy.dtensor_cfg."
            "packed_attention=auto (varlen where it runs) or per_segment"
        )

    def _storage_dtype(self) -> torch.dtype:
        """The dtype the weights are held in: float32 master weights for a model that trains;
        a frozen one (a teacher) in its precision, since FSDP's mixed precision would cast its
        float32 weights to that dtype at every forward with the same rounding: the same scores
        from half the memory in bf16."""
        return torch.float32 if self.with_optimizer else DTYPES[self.cfg.precision]

    # ---------------------------------------------------------------- compute primitives

    def set_train_mode(self, train: bool) -> None:
        # The root FSDP module keeps its parameters unsharded after a forward; a forward
        # without backward (scoring) would leave them so, and the next training step would
        # then skip gathering them. Reshard on every switch to start from a clean state.
        if isinstance(self.model, FSDPModule):
            self.model.reshard()
        self.model.train(train)

    def forward_logits(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, layout: AttentionLayout
    ) -> torch.Tensor:
        layout = self._attention_layout(layout)
        output = self.model(
            input_ids=input_ids,
            position_ids=position_ids,
            use_cache=False,
            **{LAYOUT_KWARG: layout},
        )
        logits = output.logits
        return logits.to_local() if isinstance(logits, DTensor) else logits

    def forward_hidden(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, layout: AttentionLayout
    ) -> torch.Tensor:
        # The whole model runs (FSDP gathers the root's parameters, the LM head's among them,
        # and keeps them for backward), with the head applied to the last position only; the
        # body's output, the final norm's hidden states, is taken on its way out. That
        # position is named by an index tensor, not `logits_to_keep=1`: the int's slice
        # [:, -1:] is a strided view, whose product with the head runs as a batched matmul
        # over a copy of the [H, V] weight per row (slow at a real vocabulary:
        # docs/benchmarks.md); the index gathers a contiguous [b, 1, H] (one small matmul).
        layout = self._attention_layout(layout)
        captured: list[torch.Tensor] = []
        hook = self.model.get_decoder().register_forward_hook(
            lambda module, args, output: captured.append(output.last_hidden_state)
        )
        try:
            self.model(
                input_ids=input_ids,
                position_ids=position_ids,
                use_cache=False,
                logits_to_keep=last_position(input_ids),
                **{LAYOUT_KWARG: layout},
            )
        finally:
            hook.remove()
        (hidden,) = captured
        return hidden.to_local() if isinstance(hidden, DTensor) else hidden

    @property
    def scores_shared_prefixes(self) -> bool:
        """dtensor_cfg.shared_prefix_scoring, without context parallelism (the config refuses
        it with context parallelism)."""
        return self.cfg.dtensor_cfg.shared_prefix_scoring and self.dims.cp == 1

    def _attention_layout(self, layout: AttentionLayout) -> AttentionLayout:
        """Without context parallelism (where packed rows are told apart by runs), the layout
        with its runs and how packed rows attend: computed once per microbatch, since FSDP
        hands every layer a rebuilt copy of it. With it, the layout as it is (one mask)."""
        if layout.cp_group is not None:
            return layout
        runs = segment_runs(layout.segment_ids)
        return replace(layout, runs=runs, packed_attention=self.cfg.dtensor_cfg.packed_attention)

    def output_weight(self) -> torch.Tensor:
        # After the forward the root FSDP group keeps its parameters gathered (in the compute
        # precision) for backward: the LM head's is the one the forward used.
        weight = self.model.get_output_embeddings().weight
        return weight.to_local() if isinstance(weight, DTensor) else weight

    def output_bias(self) -> torch.Tensor | None:
        bias = self.model.get_output_embeddings().bias
        return bias.to_local() if isinstance(bias, DTensor) else bias

    def zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=True)

    def apply_gradients(self) -> float:
        # FSDP has reduced over dp; the per-head norms replicated under tp still need their sum.
        if self._tp_replicated:
            all_reduce_grads(self._tp_replicated, self.tp_group)
        params = [p for p in self.model.parameters() if p.requires_grad]
        norm = clip_grad_norm(params, self.cfg.max_grad_norm)
        self.optimizer.step()
        return float(norm)

    # ---------------------------------------------------------------- memory primitives

    def offload(self) -> None:
        move_training_state(self.model, self.optimizer, torch.device("cpu"))

    def onload(self) -> None:
        move_training_state(self.model, self.optimizer, self.device)

    # ---------------------------------------------------------------- weights and checkpoints

    def iter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, full tensor on CPU in the training precision) per weight; lm_head
        included even when tied to the embedding; a LoRA student's projections merged (the
        adapters themselves are not yielded). A collective over all ranks."""
        dtype = DTYPES[self.cfg.precision]
        with self._unsharded():
            names = dict(self.model.named_parameters())
            tied = "lm_head.weight" not in names and self.hf_config.tie_word_embeddings
            for name, param in names.items():
                if is_adapter(name):
                    continue
                full = _full(param)
                if name in self._lora_pairs:
                    a, b, scaling = self._lora_pairs[name]
                    full = merged_weight(full, _full(names[a]), _full(names[b]), scaling)
                if name in VOCAB_WEIGHTS:
                    full = full[: self.vocab_size]
                full = full.detach().to("cpu", dtype, copy=True)
                yield hf_name(name), full
                if tied and name == "model.embed_tokens.weight":
                    yield "lm_head.weight", full

    @contextmanager
    def _unsharded(self) -> Iterator[None]:
        """FSDP-gathered parameters inside the block: one all-gather per FSDP group (a decoder
        layer, the root) instead of one per parameter; still DTensors over tp when tp > 1.
        The gathered storage is freed on exit: copy what must outlive the block."""
        groups = [module for module in self.model.modules() if isinstance(module, FSDPModule)]
        for module in groups:
            module.unshard()
        try:
            yield
        finally:
            for module in groups:
                module.reshard()

    def gather_weights(self) -> dict[str, torch.Tensor]:
        """The full weights, or a LoRA student's adapters under peft's keys (lora.peft_name)."""
        if self.lora:
            adapters = (item for item in self.model.named_parameters() if is_adapter(item[0]))
            return {
                peft_name(n): _full(p).detach().to("cpu", torch.float32, copy=True)
                for n, p in adapters
            }
        weights = self._full_state()
        if self.hf_config.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
        return resize_vocab_weights(weights, self.vocab_size)

    def gather_merged_weights(self) -> dict[str, torch.Tensor]:
        """A LoRA student's full fp32 weights with the adapters merged, in gather_weights'
        full-weight format (on rank 0; the other ranks get an empty dict)."""
        state = self._full_state()
        merged = merge_state(state, self._lora_pairs)
        if self.hf_config.tie_word_embeddings:
            merged.pop("lm_head.weight", None)
        return resize_vocab_weights(merged, self.vocab_size) if merged else merged

    def _full_state(self) -> dict[str, torch.Tensor]:
        """Every weight whole on the CPU, never an alias of the live parameters (an unwrapped
        model's state dict would be: the caller may keep it across optimizer steps)."""
        state = get_model_state_dict(self.model, options=FULL_ON_CPU)
        if isinstance(self.model, FSDPModule):
            return state
        return {name: tensor.detach().clone() for name, tensor in state.items()}

    def gather_optimizer_state(self) -> dict:
        state = get_optimizer_state_dict(self.model, self.optimizer, options=FULL_ON_CPU)
        return resize_vocab_optimizer_state(state, self.vocab_size)

    def write_weights(self, tmp: Path, weights: dict[str, torch.Tensor]) -> None:
        if self.lora:
            save_adapter(tmp, weights, self.lora, str(self.model_dir))
        else:
            super().write_weights(tmp, weights)

    def export(self, path: str, dtype: str = "float32") -> None:
        """A LoRA student: the merged Hugging Face model in `dtype` in `path` and its peft
        adapter in `path`/adapter (PeftModel.from_pretrained(base, path/adapter)), written
        atomically; a full-weight student: the base engine's export."""
        if not self.lora:
            return super().export(path, dtype)
        merged = self.gather_merged_weights()
        adapters = self.gather_weights()
        if dist.get_rank() == 0:
            with atomic_directory(path) as tmp:
                write_weights(tmp, merged, self.hf_config.to_dict(), dtype)
                save_adapter(tmp / ADAPTER_DIR, adapters, self.lora, str(self.model_dir))
        dist.barrier()

    def load_weights(self, root: Path) -> None:
        if self.lora:
            adapters = load_adapter(root, self.lora)
            set_model_state_dict(self.model, adapters, options=FULL_PARTIAL)
            return
        if not (root / WEIGHTS_FILE).exists() and (root / ADAPTER_WEIGHTS_FILE).exists():
            raise ValueError(
                f"{root} is a LoRA checkpoint (adapters only): resume it with "
                "policy.lora.enabled=true and the rank, alpha and target_modules of its "
                f"{ADAPTER_CONFIG_FILE}"
            )
        weights = load_file(root / WEIGHTS_FILE)
        if self.hf_config.tie_word_embeddings:
            weights.setdefault("lm_head.weight", weights["model.embed_tokens.weight"])
        weights = resize_vocab_weights(weights, self.padded_vocab_size)
        set_model_state_dict(self.model, weights, options=FULL)

    def load_optimizer_state(self, state: dict) -> None:
        state = resize_vocab_optimizer_state(state, self.padded_vocab_size)
        set_optimizer_state_dict(self.model, self.optimizer, state, options=FULL)


def last_position(input_ids: torch.Tensor) -> torch.Tensor:
    """The index [1] of the last position of input_ids [b, s], as HF's `logits_to_keep`
    tensor form reads it: the LM head on a contiguous [b, 1, H] (DTensorEngine.forward_hidden)."""
    return torch.tensor([input_ids.shape[1] - 1], device=input_ids.device)


def needs_fsdp(
    dims: ParallelDims,
    param_dtype: torch.dtype,
    cpu_offload: bool,
    storage_dtype: torch.dtype = torch.float32,
) -> bool:
    """Whether the model is wrapped with FSDP2: always, except in one process without CPU
    offload that computes in the dtype its weights are held in (float32; or a frozen model held
    in its precision), where FSDP would shard over one rank and cast each weight to its own
    dtype (and, at every forward, copy the gathered weights)."""
    return dims.world_size > 1 or param_dtype != storage_dtype or cpu_offload


def _full(param: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (DTensor) parameter: a collective over its mesh."""
    return param.full_tensor() if isinstance(param, DTensor) else param
