"""MegatronEngine: a megatron-core GPTModel with tensor parallelism behind the engine base.

Build steps: CPU shim (CPU only) -> Megatron model-parallel state (tensor parallel; the
groups must coincide with ParallelDims') -> GPTModel from the Hugging Face config
(megatron_model.py) -> load the Hugging Face checkpoint through the conversion rules
(models/hf_megatron.py) -> optimizer and scheduler.

Parallelism:
- Tensor parallel: Megatron's column/row-parallel linears, the vocab-parallel embedding and a
  column-parallel output layer with its output kept sharded, so logits are [.., V / tp]
  (rank r holds ids [r V/tp, (r+1) V/tp)). Qwen3's q/k norms act per head, so under tp each
  rank's gradient covers only its heads: they are all-reduced over tp before clipping.
- Context parallel and sequence packing: the core attention (megatron_model.
  SegmentCausalAttention) all-gathers keys and values over cp and masks by segment, as the
  DTensor engine does; RoPE angles come from the position ids.
- Data parallel: gradients are SUMMED over the dp x cp ranks (the loss is already globally
  normalized) with one all-reduce per bucket of flattened gradients after the last
  microbatch, i.e. a DDP without overlap.

Optimizer: torch AdamW from nemo_opd.policy.optim (and its schedule), over fp32 parameters,
with the global gradient norm clipped here. Megatron's own optimizer and DDP are not used:
on CPU they allocate on torch.cuda.current_device() (grad buffers, found_inf, clip_grads), and
its distributed optimizer does not run there; using one optimizer for both backends also makes
the DTensor and Megatron engines agree step for step. Optimizer state is replicated over data-
parallel ranks (megatron_cfg.distributed_optimizer is not implemented; the config rejects it).

Precision: parameters, gradients and optimizer state are fp32; with precision bfloat16 or
float16 the forward runs under torch.autocast.

Checkpoints use the DTensor engine's format (docs/policy.md): Hugging Face weights loadable by
from_pretrained, and the optimizer state unsharded by Hugging Face parameter name, so a
checkpoint loads at any tensor-parallel size (and has the structure the DTensor engine reads).

Not supported (raises): pipeline and expert parallel, sequence parallel.
"""

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from safetensors import safe_open
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from transformers import AutoConfig

from nemo_opd.config.policy import PolicyConfig
from nemo_opd.distributed.context_parallel import AttentionLayout, segment_causal_mask
from nemo_opd.distributed.parallel_dims import ParallelDims
from nemo_opd.models import resolve_pretrained
from nemo_opd.models.hf_megatron import GPTShape, Rule, conversion_rules, to_hf, to_megatron
from nemo_opd.policy.engines.base import Engine
from nemo_opd.policy.engines.megatron_model import (
    build_gpt_model,
    check_supported,
    gpt_logits,
    rope_angles,
    rope_frequencies,
    transformer_config,
)
from nemo_opd.policy.engines.training_state import (
    DTYPES,
    WEIGHTS_FILE,
    gather_rng_states,
    move_training_state,
    read_step,
    read_training_state,
    restore_rng,
    write_checkpoint,
)
from nemo_opd.policy.optim import build_training_optimizer
from nemo_opd.utils.checkpoint import atomic_directory

# Gradients are all-reduced over dp x cp in flattened buckets of about this many bytes.
GRAD_BUCKET_BYTES = 64 * 2**20
# Replicated parameters whose gradient each tensor-parallel rank computes only in part.
PER_HEAD_NORMS = ("self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight")


class MegatronEngine(Engine):
    """The Megatron backend (see the module docstring).

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
        _check_supported_layout(cfg)
        if device.type == "cpu" and not torch.cuda.is_available():
            from nemo_opd.policy.engines.megatron_cpu_shim import apply_cpu_shim

            apply_cpu_shim()
        model_dir = resolve_pretrained(cfg.model_name)
        self.hf_config = AutoConfig.from_pretrained(model_dir)
        check_supported(self.hf_config)
        self.shape = GPTShape.from_hf_config(self.hf_config)
        self.rules = conversion_rules(self.shape)
        _init_megatron_parallel(dims)
        self.model = self._build_model()
        self.params = self._params_by_rule()
        self._load_weights(_hf_reader(Path(model_dir)))
        self.inv_freq = rope_frequencies(self.hf_config).to(device)
        if with_optimizer:
            self.optimizer, self.scheduler = build_training_optimizer(
                list(self.params.values()), cfg.optimizer, cfg.scheduler, total_steps
            )
        else:
            self.model.requires_grad_(False)

    def _build_model(self) -> torch.nn.Module:
        config = transformer_config(
            self.hf_config,
            self.dims.tp,
            use_cpu_initialization=self.device.type == "cpu",
            activation_checkpointing=self.cfg.megatron_cfg.activation_checkpointing,
        )
        cp_group = self.cp_group if self.dims.cp > 1 else None
        return build_gpt_model(self.hf_config, config, cp_group).to(self.device)

    def _params_by_rule(self) -> dict[str, torch.nn.Parameter]:
        """The model's parameters in conversion-rule order (checked to be the same set)."""
        named = dict(self.model.named_parameters())
        expected = [rule.megatron_name for rule in self.rules]
        if set(named) != set(expected):
            raise RuntimeError(
                "GPTModel parameters do not match the conversion rules: "
                f"unexpected {sorted(set(named) - set(expected))}, "
                f"missing {sorted(set(expected) - set(named))}"
            )
        return {name: named[name] for name in expected}

    # ---------------------------------------------------------------- compute primitives

    @property
    def vocab_size(self) -> int:
        return self.hf_config.vocab_size

    @property
    def vocab_start(self) -> int:
        return self.vocab_size // self.dims.tp * self.dims.local_rank("tp")

    def set_train_mode(self, train: bool) -> None:
        self.model.train(train)

    def forward_logits(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, layout: AttentionLayout
    ) -> torch.Tensor:
        rotary = rope_angles(position_ids, self.inv_freq)
        visible = segment_causal_mask(layout, input_ids.shape[1], layout.segment_ids.shape[1])
        with self._autocast():
            return gpt_logits(self.model, input_ids, rotary, visible)

    def _autocast(self) -> contextlib.AbstractContextManager:
        dtype = DTYPES[self.cfg.precision]
        if dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=True)

    def finish_gradients(self, max_norm: float | None) -> torch.Tensor:
        self._reduce_grads()
        return self._clip_grads(max_norm)

    def _reduce_grads(self) -> None:
        """Complete the gradients: per-head norms over tp, then everything over dp x cp."""
        for name, param in self.params.items():
            param.grad = param.grad if param.grad is not None else torch.zeros_like(param)
            if self.dims.tp > 1 and name.endswith(PER_HEAD_NORMS):
                dist.all_reduce(param.grad, group=self.tp_group)
        if self.dims.dp * self.dims.cp == 1:
            return
        bucket: list[torch.Tensor] = []
        size = 0
        for param in self.params.values():
            bucket.append(param.grad)
            size += param.grad.numel() * param.grad.element_size()
            if size >= GRAD_BUCKET_BYTES:
                self._all_reduce_bucket(bucket)
                bucket, size = [], 0
        if bucket:
            self._all_reduce_bucket(bucket)

    def _all_reduce_bucket(self, grads: list[torch.Tensor]) -> None:
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=self.dp_cp_group)
        for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            grad.copy_(reduced)

    def _clip_grads(self, max_norm: float | None) -> torch.Tensor:
        """Global L2 norm of the full gradients (tp shards summed, replicated ones counted
        once); scales them to at most max_norm. Returns the norm before clipping."""
        sharded = torch.zeros((), dtype=torch.float32, device=self.device)
        replicated = torch.zeros((), dtype=torch.float32, device=self.device)
        for rule in self.rules:
            square = self.params[rule.megatron_name].grad.float().pow(2).sum()
            if rule.sharded:
                sharded += square
            else:
                replicated += square
        if self.dims.tp > 1:
            dist.all_reduce(sharded, group=self.tp_group)
        norm = (sharded + replicated).sqrt()
        if max_norm is not None:
            scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
            for param in self.params.values():
                param.grad.mul_(scale)
        return norm

    # ---------------------------------------------------------------- memory primitives

    def offload(self) -> None:
        move_training_state(self.model, self.optimizer, torch.device("cpu"))

    def onload(self) -> None:
        move_training_state(self.model, self.optimizer, self.device)

    # ---------------------------------------------------------------- weights and checkpoints

    def _gather_to_hf(self, rule: Rule, local: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """(HF name, full tensor) of one Megatron tensor: gathers its tp shards (a collective
        over the tp group)."""
        shards = [local]
        if rule.sharded and self.dims.tp > 1:
            shards = [torch.empty_like(local) for _ in range(self.dims.tp)]
            dist.all_gather(shards, local.contiguous(), group=self.tp_group)
        return list(zip(rule.hf_names, to_hf(rule, shards, self.shape), strict=True))

    def iter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, full tensor on CPU in the training precision) per weight; lm_head
        included even when tied to the embedding. A collective over the tp group."""
        dtype = DTYPES[self.cfg.precision]
        for rule in self.rules:
            for name, full in self._gather_to_hf(rule, self.params[rule.megatron_name].detach()):
                yield name, full.to("cpu", dtype)
                if name == "model.embed_tokens.weight" and self.shape.tied:
                    yield "lm_head.weight", full.to("cpu", dtype)

    def _load_weights(self, get_hf: Callable[[str], torch.Tensor]) -> None:
        rank, tp = self.dims.local_rank("tp"), self.dims.tp
        with torch.no_grad():
            for rule in self.rules:
                hf = [get_hf(name) for name in rule.hf_names]
                self.params[rule.megatron_name].copy_(to_megatron(rule, hf, self.shape, rank, tp))

    def save(self, path: str) -> None:
        """Write `path` atomically (rank 0 writes; every rank takes part in the gathers).

        Layout as DTensorEngine.save: config.json + model.safetensors (fp32, HF names, lm_head
        omitted when tied), training_state.pt (optimizer state by HF name, scheduler, every
        rank's RNG state), nemo_opd.json (step).
        """
        weights = {
            name: full.to("cpu", torch.float32)
            for rule in self.rules
            for name, full in self._gather_to_hf(rule, self.params[rule.megatron_name].detach())
        }
        optim = self._full_optimizer_state() if self.optimizer is not None else None
        scheduler = self.scheduler.state_dict() if self.scheduler is not None else None
        rng = gather_rng_states()
        if dist.get_rank() == 0:
            with atomic_directory(path) as tmp:
                config = self.hf_config.to_dict()
                write_checkpoint(tmp, weights, config, optim, scheduler, rng, self.step)
        dist.barrier()

    def _full_optimizer_state(self) -> dict:
        """AdamW state as torch's full optimizer state dict keyed by HF parameter name
        ({"state": {name: {...}}, "param_groups": [{..., "params": [names]}]}), the format
        the DTensor engine writes. Moments are gathered over tp and converted like weights."""
        state: dict[str, dict] = {}
        for rule in self.rules:
            local = self.optimizer.state.get(self.params[rule.megatron_name], {})
            per_name: dict[str, dict] = {name: {} for name in rule.hf_names}
            for key in ("exp_avg", "exp_avg_sq"):
                if key in local:
                    for name, full in self._gather_to_hf(rule, local[key]):
                        per_name[name][key] = full.to("cpu", torch.float32)
            if "step" in local:
                for entry in per_name.values():
                    entry["step"] = local["step"].detach().cpu().clone()
            state.update({name: entry for name, entry in per_name.items() if entry})
        names = [name for rule in self.rules for name in rule.hf_names]
        groups = [
            {**{k: v for k, v in group.items() if k != "params"}, "params": names}
            for group in self.optimizer.param_groups
        ]
        return {"state": state, "param_groups": groups}

    def _load_optimizer_state(self, full: dict) -> None:
        """Inverse of _full_optimizer_state: this rank's AdamW state from the full one."""
        rank, tp = self.dims.local_rank("tp"), self.dims.tp
        saved = full["state"]
        state = {}
        for index, rule in enumerate(self.rules):
            if rule.hf_names[0] not in saved:
                continue
            entry = {"step": saved[rule.hf_names[0]]["step"].clone()}
            for key in ("exp_avg", "exp_avg_sq"):
                hf = [saved[name][key] for name in rule.hf_names]
                entry[key] = to_megatron(rule, hf, self.shape, rank, tp)
            state[index] = entry
        group = {k: v for k, v in full["param_groups"][0].items() if k != "params"}
        group["params"] = list(range(len(self.rules)))
        self.optimizer.load_state_dict({"state": state, "param_groups": [group]})

    def load(self, path: str) -> None:
        """Restore what save() wrote (the same world size is needed for the RNG states)."""
        root = Path(path)
        self._load_weights(_hf_reader(root))
        state = read_training_state(root)
        if state is not None:
            if self.optimizer is not None and state["optimizer"] is not None:
                self._load_optimizer_state(state["optimizer"])
                self.scheduler.load_state_dict(state["scheduler"])
            restore_rng(state["rng"])
        self.step = read_step(root, self.step)
        dist.barrier()


def _check_supported_layout(cfg: PolicyConfig) -> None:
    """Backstop for engines built outside a validated DistillationConfig (the config check
    check_backend_features_available reports these at load time)."""
    mcfg = cfg.megatron_cfg
    unsupported = {
        "pipeline_model_parallel_size": mcfg.pipeline_model_parallel_size > 1,
        "expert_model_parallel_size": mcfg.expert_model_parallel_size > 1,
        "sequence_parallel": mcfg.sequence_parallel,
        "distributed_optimizer": mcfg.distributed_optimizer,
    }
    for key, used in unsupported.items():
        if used:
            raise NotImplementedError(f"megatron_cfg.{key} is not supported yet")


def _init_megatron_parallel(dims: ParallelDims) -> None:
    """Megatron's model-parallel state with tp = dims.tp and cp folded into data parallel
    (the engine's attention does context parallelism); checks its groups equal dims'."""
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=dims.tp,
            distributed_timeout_minutes=5,
            create_gloo_process_groups=False,
        )
    pairs = (
        (parallel_state.get_tensor_model_parallel_group(), dims.group("tp")),
        (parallel_state.get_data_parallel_group(), dims.group("dp_cp")),
    )
    for megatron_group, group in pairs:
        ranks = dist.get_process_group_ranks(megatron_group)
        if ranks != dist.get_process_group_ranks(group):
            raise RuntimeError(
                f"Megatron's process group {ranks} differs from the engine's "
                f"{dist.get_process_group_ranks(group)} (was Megatron initialized elsewhere?)"
            )


def _hf_reader(root: Path) -> Callable[[str], torch.Tensor]:
    """name -> fp32 CPU tensor from a Hugging Face safetensors checkpoint (single file or
    sharded with model.safetensors.index.json), reading one tensor at a time."""
    index = root / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
    elif (root / WEIGHTS_FILE).exists():
        weight_map = None
    else:
        raise FileNotFoundError(f"{root} has no {WEIGHTS_FILE} or model.safetensors.index.json")

    def read(name: str) -> torch.Tensor:
        file = root / (weight_map[name] if weight_map is not None else WEIGHTS_FILE)
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            return handle.get_tensor(name).float()

    return read
