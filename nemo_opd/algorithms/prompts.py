"""Prompt samples for the loop: dataset records rendered into tokenized message logs, with
prompts that are too long skipped and counted."""

from collections.abc import Callable
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from nemo_opd.algorithms.preflight import record_options
from nemo_opd.config import DistillationConfig
from nemo_opd.data.chat import ChatFormatter, read_text_file
from nemo_opd.data.datasets import load_prompt_records
from nemo_opd.data.message_log import log_length
from nemo_opd.data.progress import CountProgress
from nemo_opd.data.prompt_cache import PromptCache
from nemo_opd.errors import SetupError
from nemo_opd.tools.base import tool_schemas
from nemo_opd.utils.text_width import wrapped


@dataclass
class PromptSet:
    """Samples {"message_log", "metadata": {"answer", "prompt", "response" with
    data.response_key, "teacher" (its name) with several teachers}} and how many were
    skipped."""

    samples: list[dict]
    skipped: int


def encode_prompts(
    records: list[dict], formatter: ChatFormatter, max_tokens: int, where: str
) -> PromptSet:
    """Render every record; records whose prompt exceeds max_tokens are skipped (not an error:
    real datasets have a few outliers). Raises SetupError when nothing is left."""
    return start_encoding_prompts(records, formatter, max_tokens, where)()


def start_encoding_prompts(
    records: list[dict],
    formatter: ChatFormatter,
    max_tokens: int,
    where: str,
    cache: PromptCache | None = None,
) -> Callable[[], PromptSet]:
    """encode_prompts in two halves: the records are rendered now and tokenized in a thread of
    their own (ChatFormatter.start_prompt_logs); the returned function waits for that and
    returns what encode_prompts returns. Either half that takes long prints its progress. With
    a `cache`, token ids stored by an earlier run for the same records and formatter are read
    instead (data.prompt_cache)."""
    logs = formatter.start_prompt_logs(
        [record["prompt"] for record in records],
        [record.get("messages") for record in records],
        rendering=CountProgress(f"data: rendering the {where} prompts"),
        tokenizing=CountProgress(f"data: tokenizing the {where} prompts"),
        cache=cache,
    )
    return lambda: _usable_prompts(records, logs(), max_tokens, where)


def _usable_prompts(
    records: list[dict], logs: list[list], max_tokens: int, where: str
) -> PromptSet:
    """The records' samples, those longer than max_tokens skipped and counted; SetupError
    when nothing is left."""
    samples, skipped = [], 0
    for record, log in zip(records, logs, strict=True):
        if log_length(log) > max_tokens:
            skipped += 1
            continue
        metadata = {"answer": record["answer"], "prompt": record["prompt"]}
        if "response" in record:  # data.response_key: the off-policy steps' assistant turn
            metadata["response"] = record["response"]
        if "teacher" in record:  # data.teacher_key: the teacher that scores this prompt
            metadata["teacher"] = record["teacher"]
        samples.append({"message_log": log, "metadata": metadata})
    if not samples:
        raise SetupError(
            f"{where}: all {len(records)} prompts are longer than {max_tokens} tokens "
            "(data.max_input_seq_length); raise it or policy.max_total_sequence_length"
        )
    return PromptSet(samples, skipped)


def check_fills_one_batch(train: PromptSet, batch_size: int, max_tokens: int) -> None:
    """Raise SetupError when the usable train prompts (those not skipped as longer than
    max_tokens) cannot fill one step's batch of batch_size prompts."""
    usable = len(train.samples)
    if usable >= batch_size:
        return
    problem = f"there are only {usable} usable train prompts"
    lower = f"lower distillation.num_prompts_per_step to at most {usable}"
    fixes = f"{lower} or add prompts"
    if train.skipped:
        problem += f" ({train.skipped} skipped as longer than {max_tokens} tokens)"
        fixes = f"{lower}, add prompts, or raise data.max_input_seq_length"
    raise SetupError(f"distillation.num_prompts_per_step is {batch_size} but {problem}: {fixes}")


def repeat_samples(samples: list[dict], times: int) -> tuple[list, list]:
    """Message logs and metadata with every sample repeated `times` times in a row
    (num_generations_per_prompt rollouts of each prompt)."""
    logs = [s["message_log"] for s in samples for _ in range(times)]
    metadata = [dict(s["metadata"]) for s in samples for _ in range(times)]
    return logs, metadata


def load_prompts(
    cfg: DistillationConfig, tokenizer: PreTrainedTokenizerBase
) -> tuple[ChatFormatter, PromptSet, PromptSet]:
    """The chat formatter and the train and validation prompts, rendered with the chat template
    and tokenized (too-long prompts skipped and counted; no validation prompts when the run
    never validates); SetupError on bad data."""
    return start_loading_prompts(cfg, tokenizer)()


def start_loading_prompts(
    cfg: DistillationConfig, tokenizer: PreTrainedTokenizerBase
) -> Callable[[], tuple[ChatFormatter, PromptSet, PromptSet]]:
    """load_prompts in two halves: the records are read and rendered now (SetupError on bad
    data), and tokenized in threads of their own while the caller goes on (setup builds vLLM
    meanwhile: the tokenizer's Rust code runs beside it); the returned function waits for them
    and returns what load_prompts returns. The caller must not use `tokenizer` until then."""
    formatter = ChatFormatter(
        tokenizer,
        read_text_file(cfg.data.prompt_file, "data.prompt_file"),
        read_text_file(cfg.data.system_prompt_file, "data.system_prompt_file"),
        cfg.policy.tokenizer.chat_template_kwargs,
        tools=offered_tools(cfg),
    )
    max_prompt = cfg.data.max_input_seq_length or cfg.policy.max_total_sequence_length - 1
    cache = PromptCache() if cfg.data.cache_encoded_prompts else None
    records = load_prompt_records(cfg.data, "train", **record_options(cfg, "train"))
    train = start_encoding_prompts(records, formatter, max_prompt, "train", cache)
    val = lambda: PromptSet([], 0)  # noqa: E731 - a run that never validates needs no data
    if cfg.distillation.validates:
        options = record_options(cfg, "validation")
        val_records = load_prompt_records(cfg.data, "validation", **options)
        val = start_encoding_prompts(val_records, formatter, max_prompt, "validation", cache)
    return lambda: _loaded_prompts(cfg, formatter, train(), val(), max_prompt)


def _loaded_prompts(
    cfg: DistillationConfig,
    formatter: ChatFormatter,
    train: PromptSet,
    val: PromptSet,
    max_prompt: int,
) -> tuple[ChatFormatter, PromptSet, PromptSet]:
    """load_prompts' answer once the prompts are tokenized: printed and checked."""
    if cfg.distillation.max_val_samples is not None:
        val.samples = val.samples[: cfg.distillation.max_val_samples]
    line = (
        f"data: {len(train.samples)} train prompts ({train.skipped} skipped as longer than "
        f"{max_prompt} tokens), {len(val.samples)} validation prompts ({val.skipped} skipped)"
    )
    print(wrapped(line))
    check_fills_one_batch(train, cfg.distillation.num_prompts_per_step, max_prompt)
    return formatter, train, val


def offered_tools(cfg: DistillationConfig) -> list[dict] | None:
    """The tools env.tools offers, as the chat template takes them (None for none);
    SetupError for a tool that cannot be loaded."""
    try:
        return tool_schemas(cfg.env.tools.names)
    except ValueError as error:
        raise SetupError(f"env.tools.names: {error}") from None
