"""Where prompts come from and how rollouts are graded."""

from pydantic import Field

from nemo_opd.config.base import Section


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

    prompt_file: str | None = None
    """A text file with the user-prompt template ("{}" is replaced by the prompt); null uses the
    prompt as is."""

    system_prompt_file: str | None = None
    """A text file with the system prompt; null means no system message."""

    max_input_seq_length: int | None = Field(None, gt=0)
    """Prompts longer than this many tokens are skipped; must be below
    policy.max_total_sequence_length. Null means policy.max_total_sequence_length - 1."""

    shuffle: bool = True
    """Shuffle the training prompts every epoch."""


class MathEnvConfig(Section):
    """The math environment: verifies the final answer of each rollout."""

    num_workers: int = Field(8, gt=0)
    """Parallel answer-verification workers."""

    timeout_s: float = Field(10.0, gt=0)
    """Seconds allowed to verify one answer before it counts as wrong."""

    max_answer_chars: int = Field(1000, gt=0)
    """Extracted answers longer than this count as wrong without being parsed."""

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
