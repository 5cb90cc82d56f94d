"""The recipe of the tiny assets: everything that decides what gets built, hashed to a cache key.

Change any field (or bump ``FORMAT_VERSION`` when the build code changes what it writes) and the
assets are rebuilt under a new key; old builds stay where they are.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace

from nemo_opd.tiny.task import TinyMathConfig

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
"""The file a complete build writes last (assets.py reads it, build.py writes it)."""
ROLES = ("teacher", "student")


@dataclass(frozen=True)
class TokenizerRecipe:
    """BPE training: at most ``vocab_size`` tokens, merges seen at least ``min_frequency`` times,
    trained on the first ``num_train_records`` train records."""

    vocab_size: int = 512
    min_frequency: int = 2
    num_train_records: int = 20_000
    model_max_length: int = 256
    chat_style: str | None = None
    """The chat template: None for ChatML ("<|im_start|>user\\n...<|im_end|>"), "plain" for
    "### user:\\n..." headers (nemo_opd.tiny.tokenizer.CHAT_TEMPLATES)."""


@dataclass(frozen=True)
class ModelRecipe:
    """Qwen3 dimensions (the defaults are the teacher's). Embeddings are tied; the vocab size
    comes from the tokenizer."""

    hidden_size: int = 64
    num_layers: int = 3
    num_heads: int = 2
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 256
    max_position_embeddings: int = 256
    rope_theta: float = 10_000.0


@dataclass(frozen=True)
class TrainRecipe:
    """Supervised fine-tuning on the chat-formatted train split, loss on assistant tokens only.

    AdamW with linear warmup then cosine decay to ``min_lr_ratio * lr``; a fixed number of
    steps and a fixed seed (model init and data order).
    """

    steps: int = 8500
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    adam_betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class ToolsRecipe:
    """The tool task (nemo_opd.tiny.tool_task): ``offered_share`` of the train problems are
    shown with the calculator offered; on those the teacher's solutions call it for the
    problems tool_task.needs_calculator picks, the student's on ``student_call_share`` of
    them whatever the problem. Evaluation allows ``max_turns`` assistant turns."""

    offered_share: float = 0.5
    max_turns: int = 3
    student_call_share: float = 0.1
    """Share of the offered problems (spread evenly, whatever the arithmetic) on which the
    student's solutions call the calculator: a student that knows the call format, as real
    students do from their instruction tuning, but not when a call pays."""


# The student is wider than the teacher but stopped early in its supervised training, at a
# constant learning rate: on this task a narrow student (64 x 2) learns so little per example
# that a few minutes of distillation on a 2-core CPU barely move it, while a wide one climbs.
# It stops at 2,000 steps, where its learning curve is steepest: distillation from there gains
# far more per rollout than from earlier stops (docs/tiny_assets.md has the measurements). The
# demo shows knowledge moving from a trained model to a partly trained one, not compression.
STUDENT = ModelRecipe(
    hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=4, intermediate_size=512
)
STUDENT_TRAIN = TrainRecipe(steps=2000, min_lr_ratio=1.0, seed=1)


@dataclass(frozen=True)
class TinyRecipe:
    """Task, tokenizer, teacher and student. ``torch_threads`` is part of the recipe because the
    thread count may change floating-point reduction order, hence the trained weights. The
    student is STUDENT, trained by STUDENT_TRAIN (see their comment); None builds no student
    (a second teacher's recipe)."""

    task: TinyMathConfig = field(default_factory=TinyMathConfig)
    tokenizer: TokenizerRecipe = field(default_factory=TokenizerRecipe)
    teacher: ModelRecipe = field(default_factory=ModelRecipe)
    teacher_train: TrainRecipe = field(default_factory=TrainRecipe)
    student: ModelRecipe | None = field(default_factory=lambda: STUDENT)
    student_train: TrainRecipe | None = field(default_factory=lambda: STUDENT_TRAIN)
    eval_batch_size: int = 512
    eval_max_new_tokens: int = 32
    torch_threads: int = 2
    format_version: int = FORMAT_VERSION
    tools: ToolsRecipe | None = None
    """The tool task's data and evaluation; None for the plain task."""


def recipe_key(recipe: TinyRecipe) -> str:
    """A short stable hash of every field of the recipe. Fields that are None are left out, so
    that optional fields added later keep the keys of the recipes that do not set them."""
    canonical = json.dumps(_without_none(asdict(recipe)), sort_keys=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:12]


def role_key(recipe: dict, role: str) -> str:
    """A short hash of what decides the `role` model of a build, from its recipe as a dict
    (asdict, or a manifest's "recipe"): everything but the other role's model and training
    (and, for the teacher, the student's share of calls). Builds with the same role key train
    the same model."""
    fields = _without_none(recipe)
    other = "student" if role == "teacher" else "teacher"
    fields.pop(other, None)
    fields.pop(f"{other}_train", None)
    if role == "teacher" and "tools" in fields:
        fields["tools"] = {k: v for k, v in fields["tools"].items() if k != "student_call_share"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode("utf-8")).hexdigest()[:12]


def _without_none(value):
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    return value


def default_recipe() -> TinyRecipe:
    """The recipe behind ``tiny:teacher``, ``tiny:student`` and ``tiny:tokenizer``."""
    return TinyRecipe()


def xtok_recipe() -> TinyRecipe:
    """The recipe behind ``tiny:xtok_teacher`` and ``tiny:xtok_tokenizer``: a teacher like the
    default one (same task, model and training) with another tokenizer (BPE with fewer merges,
    so other ids and other splits) and another chat template ("### user:" headers), for a
    teacher with another tokenizer. No student: the default one distills from it."""
    return replace(
        default_recipe(),
        tokenizer=TokenizerRecipe(vocab_size=320, chat_style="plain"),
        student=None,
        student_train=None,
    )


def tools_recipe() -> TinyRecipe:
    """The recipe behind ``tiny:tools_teacher``, ``tiny:tools_student`` and
    ``tiny:tools_tokenizer``: the tool task (nemo_opd.tiny.tool_task), with a tokenizer whose
    chat template offers tools and whose vocabulary holds the call format, and the default
    models and training, on one torch thread (on a CPU shared with other work, two threads
    wait for each other: docs/tiny_assets.md)."""
    return replace(
        default_recipe(),
        tokenizer=TokenizerRecipe(vocab_size=640, chat_style="tools"),
        eval_max_new_tokens=40,
        torch_threads=1,
        tools=ToolsRecipe(),
    )


def micro_recipe() -> TinyRecipe:
    """A seconds-long build for tests: few problems, tiny models, a handful of steps."""
    # Two heads so that tensor parallelism 2 applies; head_dim 32 because vLLM's CPU
    # attention has no kernel for 16.
    small = ModelRecipe(
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    steps = TrainRecipe(steps=4, batch_size=16, warmup_steps=1)
    return TinyRecipe(
        task=TinyMathConfig(num_train=400, num_validation=40),
        tokenizer=TokenizerRecipe(vocab_size=320, num_train_records=400, model_max_length=128),
        teacher=small,
        teacher_train=steps,
        student=small,
        student_train=replace(steps, steps=2, seed=1),
        eval_batch_size=40,
        eval_max_new_tokens=8,
    )


def recipe_roles(recipe: TinyRecipe) -> tuple[str, ...]:
    """The roles a recipe builds (a second teacher's recipe has no student)."""
    return tuple(role for role in ROLES if getattr(recipe, role) is not None)
