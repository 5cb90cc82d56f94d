"""MegatronEngine: a megatron-core GPTModel with tensor parallelism behind the engine base.

Build steps: CPU shim (CPU only) -> Megatron model-parallel state (tensor parallel; the
groups must coincide with ParallelDims') -> GPTModel from the Hugging Face config
(megatron_model.py), its vocabulary padded (vocab_padding.py) -> load the Hugging Face
checkpoint through the conversion rules (megatron_convert.py, which pads the vocabulary rows on
the way in and strips them on the way out) -> Megatron DDP and optimizer
(megatron_optimizer.py) and the learning-rate schedule.

Parallelism:
- Tensor parallel: Megatron's column/row-parallel linears, the vocab-parallel embedding and a
  column-parallel output layer with its output kept sharded, so logits are [.., V_pad / tp]
  (rank r holds ids [r V_pad/tp, (r+1) V_pad/tp)). Qwen3's q/k norms act per head, so under
  tp each rank's gradient covers only its heads: they are all-reduced over tp before
  clipping.
- Context parallel and sequence packing: the core attention (megatron_model.
  SegmentCausalAttention) all-gathers keys and values over cp and masks by segment, as the
  DTensor engine does; RoPE angles come from the position ids.
- Data parallel: Megatron's DistributedDataParallel accumulates gradients in its fp32
  buffers and SUMS them over the dp x cp ranks after the last microbatch (the loss is
  already globally normalized).

Optimizer: Megatron's (get_megatron_optimizer: Adam with decoupled weight decay, fp32, its
global-norm clipping), with the schedule of nemo_opd.policy.optim driving the torch optimizer
inside it. On CPU every call into Megatron's DDP and optimizer runs inside the shim's
cuda_free() block. Optimizer state is replicated over data-parallel ranks: Megatron's
distributed optimizer does not run on CPU (megatron_cfg.distributed_optimizer is rejected).

Precision: parameters, gradients and optimizer state are fp32; with precision bfloat16 or
float16 the forward runs under torch.autocast. On CPU only a frozen teacher may do so:
megatron-core's linear layers restore CUDA autocast alone in their backward, so a reduced-
precision student is refused there.

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

from nemo_opd.config import PolicyConfig
from nemo_opd.distributed.context_parallel import AttentionLayout, segment_causal_mask
from nemo_opd.distributed.parallel_dims import ParallelDims
from nemo_opd.policy.engines.base import Engine
from nemo_opd.policy.engines.megatron_convert import (
    GPTShape,
    Rule,
    conversion_rules,
    to_hf,
    to_megatron,
)
from nemo_opd.policy.engines.megatron_model import (
    build_gpt_model,
    check_supported,
    gpt_hidden,
    gpt_logits,
    gpt_output_weight,
    rope_angles,
    rope_frequencies,
    transformer_config,
)
from nemo_opd.policy.engines.megatron_optimizer import build_megatron_optimizer, wrap_ddp
from nemo_opd.policy.engines.training_state import DTYPES, WEIGHTS_FILE, move_training_state
from nemo_opd.policy.optim import build_scheduler

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
        self.on_cpu = device.type == "cpu" and not torch.cuda.is_available()
        if self.on_cpu and with_optimizer and cfg.precision != "float32":
            raise ValueError(
                f"policy.precision={cfg.precision}: megatron-core's linear layers cannot train "
                "under autocast on a CPU (their backward restores CUDA autocast only, so "
                f"{cfg.precision} gradients meet fp32 weights). Use policy.precision=float32 on "
                "CPU; a frozen teacher may keep bfloat16"
            )
        if self.on_cpu:
            from nemo_opd.policy.engines.megatron_cpu_shim import apply_cpu_shim

            apply_cpu_shim()
        check_supported(self.hf_config)
        self.shape = GPTShape.from_hf_config(
            self.hf_config, dims.tp, cfg.make_vocab_size_divisible_by
        )
        self.rules = conversion_rules(self.shape)
        _init_megatron_parallel(dims)
        self.model = self._build_model()
        self.params = self._params_by_rule()
        self.load_weights(Path(self.model_dir))
        self.inv_freq = rope_frequencies(self.hf_config).to(device)
        self.ddp = None
        if with_optimizer:
            if cfg.optimizer is None:
                raise ValueError("a trainable policy needs an optimizer section")
            with self._megatron_calls():
                self.ddp = wrap_ddp(self.model, self.model.config)
                self.megatron_optimizer, self.optimizer = build_megatron_optimizer(
                    self.ddp, cfg.optimizer, cfg.max_grad_norm
                )
            self.scheduler = build_scheduler(self.optimizer, cfg.scheduler, total_steps)
        else:
            self.model.requires_grad_(False)

    def _megatron_calls(self) -> contextlib.AbstractContextManager:
        """The context every call into Megatron's DDP and optimizer runs in: the CPU shim's
        cuda_free() on a machine without a GPU, nothing otherwise."""
        if not self.on_cpu:
            return contextlib.nullcontext()
        from nemo_opd.policy.engines.megatron_cpu_shim import cuda_free

        return cuda_free()

    def _build_model(self) -> torch.nn.Module:
        config = transformer_config(
            self.hf_config,
            self.dims.tp,
            use_cpu_initialization=self.device.type == "cpu",
            activation_checkpointing=self.cfg.megatron_cfg.activation_checkpointing,
        )
        cp_group = self.cp_group if self.dims.cp > 1 else None
        model = build_gpt_model(self.hf_config, config, cp_group, self.padded_vocab_size)
        return model.to(self.device)

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
        for rule in self.rules:
            _mark_tensor_parallel(named[rule.megatron_name], rule)
        return {name: named[name] for name in expected}

    # ---------------------------------------------------------------- compute primitives

    def set_train_mode(self, train: bool) -> None:
        self.model.train(train)

    def forward_logits(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, layout: AttentionLayout
    ) -> torch.Tensor:
        return self._run_model(gpt_logits, input_ids, position_ids, layout)

    def forward_hidden(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, layout: AttentionLayout
    ) -> torch.Tensor:
        return self._run_model(gpt_hidden, input_ids, position_ids, layout)

    def _run_model(self, run, input_ids, position_ids, layout: AttentionLayout) -> torch.Tensor:
        """run(model, input_ids, rotary angles, visibility mask) under the autocast: the
        logits (gpt_logits) or the final hidden states (gpt_hidden)."""
        rotary = rope_angles(position_ids, self.inv_freq)
        visible = segment_causal_mask(layout, input_ids.shape[1], layout.segment_ids.shape[1])
        with self._autocast():
            return run(self.model, input_ids, rotary, visible)

    def output_weight(self) -> torch.Tensor:
        return gpt_output_weight(self.model)

    def _project(
        self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        with self._autocast():  # the precision the output layer computes in
            return super()._project(hidden, weight, bias)

    def _autocast(self) -> contextlib.AbstractContextManager:
        dtype = DTYPES[self.cfg.precision]
        if dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    def zero_grad(self) -> None:
        if self.ddp is not None:
            self.ddp.zero_grad_buffer()
        self.model.zero_grad(set_to_none=True)

    def apply_gradients(self) -> float:
        """Sum the per-head norm gradients over tp (each rank saw only its heads), let DDP sum
        the buffers over dp x cp, then Megatron's optimizer clips (cfg.max_grad_norm, set at
        build) and steps. Returns the global norm before clipping."""
        if self.dims.tp > 1:
            for name, param in self.params.items():
                if name.endswith(PER_HEAD_NORMS):
                    dist.all_reduce(param.main_grad, group=self.tp_group)
        with self._megatron_calls():
            self.ddp.finish_grad_sync()
            _, grad_norm, _ = self.megatron_optimizer.step()
        return float(grad_norm)

    # ---------------------------------------------------------------- memory primitives

    def offload(self) -> None:
        move_training_state(self.model, self.optimizer, torch.device("cpu"))
        if self.ddp is not None and self.device.type == "cuda":
            self.ddp.offload_grad_buffers()

    def onload(self) -> None:
        if self.ddp is not None and self.device.type == "cuda":
            self.ddp.restore_grad_buffers()
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

    def gather_weights(self) -> dict[str, torch.Tensor]:
        return {
            name: full.to("cpu", torch.float32)
            for rule in self.rules
            for name, full in self._gather_to_hf(rule, self.params[rule.megatron_name].detach())
        }

    def gather_optimizer_state(self) -> dict:
        """AdamW's moments gathered over tp and converted like the weights (the format the
        DTensor engine writes)."""
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
        # Only torch AdamW's hyperparameters (and the schedule's initial_lr): Megatron's own
        # group keys (wd_mult, is_expert_parallel, ...) would not load into the DTensor engine.
        portable = set(torch.optim.AdamW([torch.zeros(1)]).defaults) | {"initial_lr"}
        groups = [
            {**{k: v for k, v in group.items() if k in portable}, "params": names}
            for group in self.optimizer.param_groups
        ]
        return {"state": state, "param_groups": groups}

    def load_weights(self, root: Path) -> None:
        """Weights from a Hugging Face safetensors checkpoint (single file or sharded with an
        index), read one tensor at a time."""
        get_hf = _hf_reader(root)
        rank, tp = self.dims.local_rank("tp"), self.dims.tp
        with torch.no_grad():
            for rule in self.rules:
                hf = [get_hf(name) for name in rule.hf_names]
                self.params[rule.megatron_name].copy_(to_megatron(rule, hf, self.shape, rank, tp))

    def load_optimizer_state(self, state: dict) -> None:
        rank, tp = self.dims.local_rank("tp"), self.dims.tp
        saved = state["state"]
        # torch keys a state dict by position in the group, which is Megatron's order
        params = self.optimizer.param_groups[0]["params"]
        position = {id(param): index for index, param in enumerate(params)}
        local = {}
        for rule in self.rules:
            if rule.hf_names[0] not in saved:
                continue
            entry = {"step": saved[rule.hf_names[0]]["step"].clone()}
            for key in ("exp_avg", "exp_avg_sq"):
                hf = [saved[name][key] for name in rule.hf_names]
                entry[key] = to_megatron(rule, hf, self.shape, rank, tp)
            local[position[id(self.params[rule.megatron_name])]] = entry
        # Keep Megatron's own group keys (wd_mult, ...) next to the saved hyperparameters.
        current = {k: v for k, v in self.optimizer.param_groups[0].items() if k != "params"}
        hyper = {k: v for k, v in state["param_groups"][0].items() if k != "params"}
        group = {**current, **hyper, "params": list(range(len(params)))}
        self.optimizer.load_state_dict({"state": local, "param_groups": [group]})


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


def _mark_tensor_parallel(param: torch.nn.Parameter, rule: Rule) -> None:
    """Give a sharded parameter Megatron's tensor-parallel attributes where Megatron left them
    unset: its parallel layers set them only while initializing weights, which this engine
    skips (weights are loaded), and its optimizer's gradient norm relies on them (a parameter
    without them counts on tp rank 0 only)."""
    if rule.sharded and not getattr(param, "tensor_model_parallel", False):
        param.tensor_model_parallel = True
        param.partition_dim = rule.partition_dim
        param.partition_stride = 1


_MEGATRON_WORLD: list = [None]
"""The default process group Megatron's model-parallel state was made in (see below)."""


def _init_megatron_parallel(dims: ParallelDims) -> None:
    """Megatron's model-parallel state with tp = dims.tp and cp folded into data parallel
    (the engine's attention does context parallelism); checks its groups equal dims'.

    The state is the process's, made once and shared by its engines (a run in one process:
    the student and a Megatron teacher). A state made in a default group that has since been
    destroyed (vLLM's teardown ends the process's group at the end of a run in one process;
    the next run makes a new one) holds groups torch no longer knows: it is made again."""
    made_in_another_group = _MEGATRON_WORLD[0] is not dist.group.WORLD
    if parallel_state.model_parallel_is_initialized() and made_in_another_group:
        parallel_state.destroy_model_parallel()
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=dims.tp,
            distributed_timeout_minutes=5,
            create_gloo_process_groups=False,
        )
        _MEGATRON_WORLD[0] = dist.group.WORLD
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
