"""The configuration schema of a run: one pydantic model per section, DistillationConfig the
whole run (a model's sections, the student's and a teacher's, are in model_schema.py).

A component receives only its own section (`Policy(cfg.policy)`). The schema checks each
field; the cross-field rules (checks.py) read a validated config.
"""

from typing import Literal

from pydantic import Field

from nemo_opd.config.model_schema import PolicyConfig, TeacherConfig
from nemo_opd.config.section import (
    MAX_RANKS,
    MAX_ROWS,
    MAX_SECONDS,
    MAX_SEED,
    MAX_STALENESS,
    MAX_STEPS,
    MAX_TOKENS,
    MAX_TURNS,
    Section,
)

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
    support: Literal["teacher_topk", "full", "student_topk"] = "teacher_topk"
    """The ids the divergence runs over. teacher_topk: the teacher's top-k
    (distillation.topk_logits_k) and the tail bucket, from the teacher's top-k log-probs. full:
    every id of the vocabulary, exact (the teacher sends its final hidden states and the student's
    workers apply the teacher's LM head chunk by chunk; docs/loss.md). student_topk: the student's
    own top-k ids and the tail bucket, with the teacher's exact log-probs there (hidden states too).
    full and student_topk need one in-process teacher with the student's vocabulary, and a
    divergence term (the topk_kl objective, or policy_gradient with topk_kl_coef > 0; the teacher
    then sends its hidden states and sampled-token log-probs from one forward pass)."""


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
    samples (a vLLM engine holding the teacher, at the student's generation settings,
    policy.generation.temperature included, as TRL's GKD samples both models with one
    temperature) instead of the dataset's responses."""
    max_staleness: int = Field(0, ge=0, le=MAX_STALENESS)
    """Overlap: the rollouts of step t are sampled from the student's weights after step
    max(0, t - 1 - max_staleness), so the rollouts of the next max_staleness steps are
    generated and scored while the current step trains. 0: lockstep (sample, score, train, in
    turn, every step on the newest weights). The age is exact, not a bound, so every run
    samples alike whatever the timing; rollout/staleness logs it. Needs generation on devices
    of its own on CUDA (policy.generation.colocated.enabled false)."""
    stream_chunks: int = Field(1, ge=1, le=MAX_ROWS)
    """Generate each step's prompts in this many parts (whole prompt groups, in order) and
    score each part with the teacher while the next one generates; 1 scores the whole batch
    after generation. Any teacher kind. At most num_prompts_per_step."""
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

    @property
    def validates(self) -> bool:
        """Whether the run validates at all (val_period, val_at_start or val_at_end): without,
        no validation prompts are loaded or needed."""
        return self.val_period > 0 or self.val_at_start or self.val_at_end


# -------- data and environments -------------------------------------------------------------------


class DataConfig(Section):
    """The prompt dataset. Exactly one of dataset_name and train_path is set.

    Relative file paths written in a config file are resolved against that file's folder (those
    given on the command line against the working directory).
    """

    dataset_name: str | None = None
    """A dataset on the hub, a directory written by save_to_disk (a DatasetDict with splits, or
    a single Dataset: the training data), or "tiny_math" for the embedded synthetic arithmetic
    task."""
    val_dataset_name: str | None = None
    """A dataset to validate on (a hub name or a save_to_disk directory: a single Dataset is the
    validation data); null uses dataset_name's own validation split."""
    train_path: str | None = None
    """A local .jsonl, .json (a list of objects, or JSON lines) or .parquet file of training
    prompts (instead of dataset_name)."""
    val_path: str | None = None
    """A local .jsonl, .json or .parquet file of validation prompts (not beside val_dataset_name),
    loaded only when the run validates (distillation.val_period, val_at_start, val_at_end)."""
    val_split: str | None = None
    """Split of the validation dataset (a hub dataset with several splits); null tries
    "validation", then "test". tiny_math: "validation" (the 500 held-out problems) or
    "development" (for tuning: validates on the development split and trains on train without
    its problems, so tuning never reads the held-out split)."""
    prompt_key: str = Field("problem", min_length=1)
    """Column holding the prompt text, or chat messages (system and user turns, the last a
    user message; docs/distillation.md)."""
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
    cache_encoded_prompts: bool = True
    """Keep the prompts' token ids (rendered by the chat template, then tokenized) in
    $NEMO_OPD_CACHE/prompts (default ~/.cache/nemo_opd/prompts), keyed by the prompts, the
    template and the tokenizer, so that a later run with the same ones reads them instead of
    rendering and tokenizing again; false: every run renders and tokenizes its prompts."""


class MathEnvConfig(Section):
    """The math environment: verifies the final answer of each rollout."""

    grader: Literal["math_verify", "builtin"] = "math_verify"
    """The grading engine: math_verify (Hugging Face's math-verify, the field's standard: sets,
    intervals, relations, symbolic equivalence) or builtin (exact numbers and normalized text,
    no sympy). Either way a fast path settles certain answers first (docs/generation.md)."""
    num_workers: int = Field(8, gt=0, le=MAX_RANKS)
    """Grader worker processes (each grades one answer at a time; docs/generation.md)."""
    timeout_s: float = Field(10.0, gt=0, le=MAX_SECONDS)
    """Seconds allowed to grade one answer; past it the answer counts as wrong and its worker
    process is killed and replaced (env/math/grader_timeouts counts them)."""
    require_marked_answer: bool = True
    """A response must state its final answer in \\boxed{} (or \\fbox{}) or after an answer
    phrase ("answer is", "answer:"), and math-verify reads only such an answer, as TRL's
    accuracy reward does; an unmarked response is wrong. false: an unmarked response is read
    as math-verify reads a bare answer, its last expression, so "7 + 112 =" answers "What is
    7 + 112?" (a reward policy-gradient training learns to exploit; docs/generation.md)."""
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


class ToolsConfig(Section):
    """Tools the student may call during rollouts (docs/agentic.md): offered to the chat
    template (`tools=`), calls read in the model family's format, run in worker processes with
    a time, memory and output limit per call, results appended as `tool` messages."""

    names: list[str] = Field(default_factory=list, max_length=64)
    """The tools offered: built-in names (calculator) or "package.module:attribute" (a tool
    class or object, nemo_opd/tools/base.py). Empty: no tools, rollouts as before."""
    format: Literal["hermes", "llama3_json"] = "hermes"
    """How the model writes a call: hermes (Qwen2.5/Qwen3/Hermes: <tool_call>{"name": ...,
    "arguments": {...}}</tool_call>) or llama3_json (Llama 3.x: the turn is {"name": ...,
    "parameters": {...}})."""
    num_workers: int = Field(2, gt=0, le=MAX_RANKS)
    """Tool worker processes (each runs one call at a time)."""
    timeout_s: float = Field(5.0, gt=0, le=MAX_SECONDS)
    """Seconds a call may take; past it its worker is killed and replaced, and the model
    reads a time-out error (env/<task>/tool_error/timeout)."""
    memory_mb: int = Field(1024, ge=256, le=1 << 20)
    """Address-space cap of each tool worker (MiB): an allocation past it is a tool error."""
    max_output_chars: int = Field(4096, gt=0, le=MAX_TOKENS)
    """Longest result a call may return (characters); a longer one is a tool error."""
    max_call_chars: int = Field(4096, gt=0, le=MAX_TOKENS)
    """Longest call (characters of its JSON): a longer one is a tool error, never parsed."""
    max_calls_per_turn: int = Field(4, gt=0, le=64)
    """Calls run per assistant turn, each answered by a tool message; the calls past it are
    not run, and the model reads one error for all of them."""
    turn_budget_s: float | None = Field(15.0, gt=0, le=MAX_SECONDS)
    """Seconds for all the calls of one assistant turn, from its first call's start (time
    outs and the restarts of killed workers included): past it the turn's calls still waiting
    are not run and one still running is stopped, each a tool error
    (env/<task>/tool_error/budget). null: no budget."""
    step_budget_s: float | None = Field(300.0, gt=0, le=MAX_SECONDS)
    """Seconds for all the calls of one environment step (a turn of every conversation of a rollout
    batch), from its start: past it the step's remaining calls fail as turn_budget_s says. A batch
    of many calls needs more (calls x seconds a call / num_workers). null: no budget."""
    pass_env: list[str] = Field(default_factory=list, max_length=64)
    """Environment variables the tool workers get from the driver (an API key a tool of
    yours needs). They get only PATH, HOME, TMPDIR, the locale, LD_LIBRARY_PATH, PYTHONHOME,
    PYTHONHASHSEED and PYTHONPATH otherwise: the driver's secrets stay in the driver."""


class EnvConfig(Section):
    """The environments that grade rollouts (reward and accuracy)."""

    math: MathEnvConfig = Field(default_factory=MathEnvConfig)
    """The math answer-verification environment."""
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    """Tools the student may call before it answers (none by default)."""


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
    """Log to Weights & Biases (the `wandb` extra, wandb 0.19 or newer): the redacted config,
    the metrics and sample rollouts; W&B is told not to record the command line, the git state
    or the code."""
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    """W&B settings, used when wandb_enabled."""
    num_rollouts_to_log: int = Field(2, ge=0, le=MAX_ROWS)
    """Rollouts (prompt, response, reward) printed and logged at the steps of
    rollouts_log_period."""
    rollouts_log_period: int = Field(50, ge=0, le=MAX_STEPS)
    """Print and log num_rollouts_to_log sample rollouts at a process's first step and then
    every this many steps (to the console, TensorBoard and W&B); 0 never."""
    rollout_dump_period: int = Field(0, ge=0, le=MAX_STEPS)
    """Write every rollout of a step to log_dir/rollouts/ every this many steps; 0 never."""


class ClusterConfig(Section):
    """The workers that train and generate."""

    num_nodes: int = Field(1, gt=0, le=MAX_RANKS)
    """Nodes in the cluster."""
    gpus_per_node: int = Field(1, gt=0, le=MAX_RANKS)
    """Worker processes per node: one per GPU, or CPU worker processes when device is cpu."""
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """cuda, cpu, or auto (cuda when the executor sees a GPU: the Ray cluster, or this machine
    under the local and processes executors; else cpu); the run prints which, and why, at
    start."""
    cpus_per_worker: int = Field(1, gt=0, le=MAX_RANKS)
    """CPU cores reserved per worker process."""
    address: str | None = Field(None, min_length=1)
    """The Ray cluster to run on: its head's GCS address host:port (what `ray start --head`
    prints for `ray start --address`), or "auto" for the cluster `ray start` started on this
    node. Null: the RAY_ADDRESS environment variable if set (`ray job submit` sets it), else
    a local Ray instance started for the run and stopped after it (docs/cluster.md)."""
    executor: Literal["auto", "ray", "local", "processes"] = "auto"
    """What runs the workers: ray (each worker a Ray actor in a process of its own, placed by
    a placement group: more than one worker, several nodes, a cluster, a served teacher),
    local (the student, the teacher and the generation engine as objects in the driver's own
    process, no Ray: one worker) or processes (each worker a process of this machine forked
    from a server that imported the engines once, no Ray: several workers on one node). auto:
    local when nothing needs Ray (one worker, no served teacher, no cluster.address and no
    RAY_ADDRESS), else ray (docs/distillation.md, "Executors"). A served teacher is the
    driver's HTTP client, so local or processes run it too when set. local or processes with
    something they cannot run is refused with the reason."""

    @property
    def world_size(self) -> int:
        """Worker processes in the whole cluster."""
        return self.num_nodes * self.gpus_per_node


class CheckpointingConfig(Section):
    """Periodic checkpoints of the student (weights, optimizer, data position)."""

    enabled: bool = True
    """Save checkpoints."""
    checkpoint_dir: str = Field("results/distillation", min_length=1)
    """Directory holding one subdirectory per saved step, and the final model (final_model)."""
    resume: Literal["auto", "force"] = "auto"
    """auto: resume the newest checkpoint of checkpoint_dir only when the run that saved it had
    this run's models, data, objective and shapes (nemo_opd.utils.run_identity; max_num_steps,
    validation, logging, the save cadence and the learning rate may change), and append to
    logger.log_dir only when it holds this run's metrics; otherwise stop at start, naming each
    difference. force: resume those checkpoints and append to those metrics whatever run made
    them (the differences were meant)."""
    save_period: int = Field(10, gt=0, le=MAX_STEPS)
    """Save every save_period steps (and after the last step)."""
    keep_top_k: int | None = Field(3, ge=0, le=MAX_STEPS)
    """Keep the best keep_top_k checkpoints by metric_name (at least 1 when enabled); null
    keeps all."""
    metric_name: str | None = "validation/accuracy"
    """Metric that ranks checkpoints; null ranks by step (the most recent are kept). One the run
    logs: validation/accuracy or validation/avg_length; with a teacher validation/loss,
    forward_kl, reverse_kl or top1_agreement (with several teachers also
    validation/teacher/<name>/<metric>, accuracy too); with val_samples_per_prompt k
    validation/accuracy_avg@k or validation/pass@k; or train/loss or train/reward."""
    higher_is_better: bool = True
    """Whether a higher metric_name is better."""


# -------- the whole run ---------------------------------------------------------------------------


class DistillationConfig(Section):
    """An on-policy distillation run: every field validated, then the cross-field rules
    (nemo_opd.config.checks; the few only setup can check are listed with them)."""

    policy: PolicyConfig
    """The student: the model that generates rollouts and is trained."""
    teacher: TeacherConfig | None = None
    """The frozen teacher that grades every token of the rollouts (the policy's schema plus
    `server`, `prompt_template` and `source`; optimizer, scheduler and generation are null,
    lora off; no model is loaded with a self source). Null when no objective term uses a
    teacher (a reward-only baseline such as GRPO): then no teacher is started."""
    teachers: dict[str, TeacherConfig] | None = None
    """Several frozen teachers by name, instead of `teacher`: each prompt is scored by the one
    its record names in data.teacher_key (routing by data source; docs/gkd.md). Each entry has
    the keys of `teacher`, but a served teacher (`server.enabled`) and `prompt_template` are
    refused there (not yet); they share the workers' devices like one teacher does."""
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
        """Every teacher with a model of its own by name: `teachers`, or {"teacher": teacher},
        or {} without one (a teacher that is the student itself is `self_teacher`)."""
        if self.teachers is not None:
            return {name: t for name, t in self.teachers.items() if not t.is_self}
        has_model = self.teacher is not None and not self.teacher.is_self
        return {"teacher": self.teacher} if has_model else {}

    @property
    def self_teacher(self) -> TeacherConfig | None:
        """`teacher` when it is the student itself (source student, ema or lagged), else None."""
        return self.teacher if self.teacher is not None and self.teacher.is_self else None

    @property
    def teacher_sections(self) -> dict[str, TeacherConfig]:
        """Every teacher by its key path: {"teacher": ...}, {"teachers.<name>": ...}, or {}."""
        if self.teachers is not None:
            return {f"teachers.{name}": teacher for name, teacher in self.named_teachers.items()}
        return dict(self.named_teachers)
