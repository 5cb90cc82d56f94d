"""Chat rendering: prompts become message logs whose every message carries its token ids.

A message log is a list of dicts {"role", "content", "token_ids": list[int]}; concatenating the
token_ids of all messages gives exactly the sequence the model sees, rendered by the tokenizer's
chat template. Assistant messages keep the ids the generation engine produced (never
re-tokenized), so the trained tokens are exactly the sampled ones.

Opening messages are tokenized as the text the template adds after the conversation before
them (render(history + new) minus render(history)). An environment's reply after a generated
turn (a user message, tool results) is the text the template writes from the end of that
turn's content on, the conversation rendered whole: the rest of its end of turn (e.g.
"<|im_end|>\\n", less what the model generated of it), the new messages and the assistant
header, tokenized as one piece; so templates that write several tool results as one block
(Qwen3) or an assistant turn differently once others follow it (Qwen3's think block) read as
they would render the whole conversation.

Tools offered to the model (`tools`, the OpenAI function format of nemo_opd.tools.tool_schema)
are passed to the template wherever it renders, as transformers' `tools=`. A tool message's
content is model output echoed back (a call's arguments in an error, a tool's result): its
control strings (the tokenizer's special and markup tokens, `<|im_end|>`, `</tool_response>`)
are read as text, broken by a zero-width space after their first character
(nemo_opd.data.text_only), so that a model cannot forge turns by writing them.
"""

import hashlib
import importlib.metadata
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from transformers import PreTrainedTokenizerBase

from nemo_opd.config.templates import template_problem
from nemo_opd.data.message_log import Message
from nemo_opd.data.progress import CountProgress
from nemo_opd.data.prompt_cache import PromptCache, entry_key
from nemo_opd.data.text_only import TextOnly
from nemo_opd.data.user_files import read_user_file, read_utf8
from nemo_opd.errors import SetupError
from nemo_opd.utils.text_width import wrapped

PROGRESS_EVERY = 256
"""Prompts rendered between two looks at the clock (data.progress.CountProgress)."""
_NOT_YET = object()
"""ChatFormatter's fingerprint before it is first asked for."""
ENCODE_CHUNK = 20_000
"""Distinct texts per call of the tokenizer (a batch its Rust code spreads over the cores)."""


class ChatFormatter:
    """Turns dataset records into tokenized message logs with the tokenizer's chat template.

    Args:
        tokenizer: a tokenizer with a chat template.
        prompt_template: the user message, with "{}" replaced by the record's prompt; None uses
            the prompt as is.
        system_prompt: a system message placed first; None for no system message.
        template_kwargs: variables for the chat template (policy.tokenizer.chat_template_kwargs,
            e.g. {"enable_thinking": False}); None for none.
        tools: the tools offered to the model, as the template takes them (`tools=`); None
            for none.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_template: str | None = None,
        system_prompt: str | None = None,
        template_kwargs: dict | None = None,
        tools: list[dict] | None = None,
    ) -> None:
        if tokenizer.chat_template is None:
            raise SetupError(
                "the tokenizer has no chat template: set policy.tokenizer.chat_template to a "
                "Jinja template (file path or text)"
            )
        if prompt_template is not None:
            _check_prompt_template(prompt_template)
        self.tokenizer = tokenizer
        self.prompt_template = prompt_template
        self.system_prompt = system_prompt
        self.template_kwargs = dict(template_kwargs or {})
        self.tools = tools or None
        self._text_only = TextOnly(tokenizer)
        self._fingerprint: bytes | None | object = _NOT_YET

    def prompt_log(self, prompt: str) -> list[Message]:
        """The opening messages (system?, user) with the assistant header appended to the last
        message's tokens, ready for generation."""
        return self.prompt_logs([prompt])[0]

    def prompt_logs(
        self, prompts: list[str], conversations: list[list[Message] | None] | None = None
    ) -> list[list[Message]]:
        """prompt_log of every prompt, tokenized in one batched call (a dataset's worth of
        prompts at setup). conversations: per prompt, its chat-format messages when the
        dataset gives them (a `messages` column: the opening as written, after the system
        prompt unless it has its own), else None."""
        openings = self._openings(prompts, conversations)
        texts = self._opening_texts(openings, prompts, conversations)
        return _with_token_ids(openings, encode_unique(self.tokenizer, texts))

    def start_prompt_logs(
        self,
        prompts: list[str],
        conversations: list[list[Message] | None] | None = None,
        rendering: CountProgress | None = None,
        tokenizing: CountProgress | None = None,
        cache: PromptCache | None = None,
    ) -> Callable[[], list[list[Message]]]:
        """prompt_logs in two halves: the template renders every prompt now, in this thread,
        and the tokenizer encodes the texts in a thread of its own (encode_in_background),
        beside whatever this thread does next (setup builds vLLM meanwhile). The returned
        function waits for the encoding and returns what prompt_logs returns. `rendering` and
        `tokenizing` are told the two halves' progress (prompts rendered, distinct texts
        encoded). With a `cache` (data.prompt_cache), ids it holds for the same prompts and
        formatter are read instead of rendering and encoding, and new ones are stored."""
        openings = self._openings(prompts, conversations)
        fingerprint = self.fingerprint() if cache is not None else None
        key = None if fingerprint is None else entry_key(fingerprint, prompts, conversations)
        if key is not None:
            ids = cache.load(key)
            if ids is not None and len(ids) == sum(len(opening) for opening in openings):
                return lambda: _with_token_ids(openings, ids)
        texts = self._opening_texts(openings, prompts, conversations, rendering)
        encoded = encode_in_background(self.tokenizer, texts, tokenizing)

        def finish() -> list[list[Message]]:
            ids = encoded()
            if key is not None:
                _store_quietly(cache, key, ids)
            return _with_token_ids(openings, ids)

        return finish

    def fingerprint(self) -> bytes | None:
        """Everything the ids of an opening depend on besides its prompt or messages: the chat
        template and what it reads (its variables, the tools, the tokenizer's special tokens,
        the date where it asks for it), the system prompt and prompt template, the tokenizer's
        whole definition, and the versions of the libraries that render and encode, as a
        BLAKE2b digest of them. None for a tokenizer without a serialized definition (a slow
        one): its prompts are not cached. Made once per formatter (a real tokenizer's
        definition takes a few tenths of a second to serialize and megabytes to hash, and a
        run asks for its train and its validation prompts)."""
        if self._fingerprint is _NOT_YET:
            self._fingerprint = self._make_fingerprint()
        return self._fingerprint

    def _make_fingerprint(self) -> bytes | None:
        """fingerprint(), computed."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if not getattr(self.tokenizer, "is_fast", False) or backend is None:
            return None
        template = self.tokenizer.chat_template
        inputs = {
            "chat_template": template,
            "template_kwargs": self.template_kwargs,
            "tools": self.tools,
            "special_tokens": self.tokenizer.special_tokens_map,
            "split_special_tokens": bool(getattr(self.tokenizer, "split_special_tokens", False)),
            "today": time.strftime("%Y-%m-%d") if "strftime_now" in str(template) else None,
            "prompt_template": self.prompt_template,
            "system_prompt": self.system_prompt,
            "tokenizer_class": type(self.tokenizer).__name__,
            "versions": {name: _version(name) for name in ("transformers", "tokenizers", "jinja2")},
        }
        described = json.dumps(inputs, sort_keys=True, default=repr)
        digest = hashlib.blake2b(described.encode())
        digest.update(b"\0")
        digest.update(backend.to_str().encode())
        return digest.digest()

    def _openings(
        self, prompts: list[str], conversations: list[list[Message] | None] | None
    ) -> list[list[Message]]:
        """The opening messages of each prompt (its conversation's, where it has one), without
        token ids."""
        conversations = conversations or [None] * len(prompts)
        return [
            self._opening(prompt) if messages is None else self._conversation(messages)
            for prompt, messages in zip(prompts, conversations, strict=True)
        ]

    def _opening_texts(
        self,
        openings: list[list[Message]],
        prompts: list[str],
        conversations: list[list[Message] | None] | None,
        progress: CountProgress | None = None,
    ) -> list[str]:
        """The text the template adds for each message of the openings (_openings of the
        prompts and conversations), in order (a dataset's prompts repeat: equal prompts are
        rendered once); each PROGRESS_EVERY-th prompt tells `progress`."""
        conversations = conversations or [None] * len(prompts)
        texts, rendered = [], {}
        for index, (prompt, messages) in enumerate(zip(prompts, conversations, strict=True)):
            if progress is not None and not index % PROGRESS_EVERY:
                progress.update(index, len(prompts))
            if messages is None:
                if prompt not in rendered:
                    rendered[prompt] = self._new_texts([], openings[index])
                texts += rendered[prompt]
            else:
                texts += self._new_texts([], openings[index])
        if progress is not None:
            progress.finish(len(prompts))
        return texts

    def _opening(self, prompt: str) -> list[Message]:
        text = self.prompt_template.format(prompt) if self.prompt_template else prompt
        messages = [{"role": "user", "content": text}]
        if self.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def _conversation(self, messages: list[Message]) -> list[Message]:
        opening = [_plain(m) for m in messages]
        if self.system_prompt is not None and opening[0]["role"] != "system":
            opening.insert(0, {"role": "system", "content": self.system_prompt})
        return opening

    def extend(self, log: list[Message], new: list[Message]) -> list[Message]:
        """`log` followed by `new` (non-assistant messages), the last one ending with the
        assistant header. After an assistant turn, the reply's text is tokenized as one piece
        (module docstring), held by its first message (the others hold no tokens); tool
        messages' control strings read as text (TextOnly). Returns a new list; `log` is not
        modified."""
        new = [self._text_only.message(m) if m["role"] == "tool" else m for m in new]
        if log and log[-1]["role"] == "assistant":
            ids = self._encode(self._reply_text(log, new))
            return list(log) + [dict(m, token_ids=ids if j == 0 else []) for j, m in enumerate(new)]
        pieces = self._new_texts([_plain(m) for m in log], [_plain(m) for m in new])
        tokenized = [dict(m, token_ids=self._encode(t)) for m, t in zip(new, pieces, strict=True)]
        return list(log) + tokenized

    def _reply_text(self, log: list[Message], new: list[Message]) -> str:
        """The template's text from the end of the content of log's last (assistant) turn on,
        when `new` follows it, less the part of its end of turn the model generated."""
        turn = {"role": "assistant", "content": PLACEHOLDER}
        before = [*(_plain(m) for m in log[:-1]), turn]
        count = self._render(before, False).count(PLACEHOLDER)  # the turn's is the last one
        if not count:
            raise SetupError(
                "the chat template does not write an assistant turn's content: rollouts need "
                "one that does (policy.tokenizer.chat_template)"
            )
        full = self._render([*before, *(_plain(m) for m in new)], True)
        at = -len(PLACEHOLDER)
        for _ in range(count):
            at = full.index(PLACEHOLDER, at + len(PLACEHOLDER))
        tail = full[at + len(PLACEHOLDER) :]
        return tail[self._generated_overlap(log[-1], tail) :]

    def _generated_overlap(self, assistant: Message, tail: str) -> int:
        """How many characters of the template's text after a turn's content the model
        already generated at the end of its turn (its stop token)."""
        generated = self.tokenizer.decode(assistant["token_ids"][-4:], skip_special_tokens=False)
        for cut in range(min(len(tail), len(generated)), 0, -1):
            if generated.endswith(tail[:cut]):
                return cut
        return 0

    def response_logs(self, logs: list[list[Message]], responses: list[str]) -> list[list[Message]]:
        """Each prompt log (ending with the assistant header) followed by a written assistant
        turn: the response as the template renders it, up to and including the tokenizer's
        EOS token (where a generated turn stops), tokenized in one batched call. Returns new
        lists; `logs` are not modified."""
        texts = [self.assistant_text(log, r) for log, r in zip(logs, responses, strict=True)]
        token_ids = self._encode_many(texts)
        return [
            [*log, {"role": "assistant", "content": response, "token_ids": ids}]
            for log, response, ids in zip(logs, responses, token_ids, strict=True)
        ]

    def assistant_text(self, log: list[Message], response: str) -> str:
        """The text the template writes for an assistant turn after `log` (which ends with the
        assistant header): the response as the template renders it, then its end of turn up
        to and including the tokenizer's EOS token."""
        history = [_plain(m) for m in log]
        opening = self._render(history, True)
        full = self._render([*history, {"role": "assistant", "content": response}], False)
        if not full.startswith(opening):
            raise SetupError(
                "the chat template renders an assistant turn that does not continue the "
                "prompt it follows; responses (data.response_key) and a teacher with another "
                "tokenizer need a template that does"
            )
        return _through_eos(full[len(opening) :], self.tokenizer.eos_token)

    def _new_texts(self, history: list[Message], new: list[Message]) -> list[str]:
        """The text the template adds for each new message (the last with the assistant
        header)."""
        texts, rendered = [], self._render(history, False) if history else ""
        for index in range(len(new)):
            last = index == len(new) - 1
            full = self._render(history + new[: index + 1], last)
            if not full.startswith(rendered):
                # Templates that rewrite earlier turns: render the new message on its own.
                full, rendered = rendered + self._render(new[index : index + 1], last), rendered
            texts.append(full[len(rendered) :])
            rendered = full
        return texts

    def closing_text(self, history: list[Message]) -> str:
        """The text the template writes after an assistant turn's content when the turn
        follows `history`: its end of turn, up to and including the tokenizer's EOS token if
        there (found by rendering a placeholder content, so that a template that trims or
        rewrites content does not hide it). SetupError if the template drops the content."""
        turn = {"role": "assistant", "content": PLACEHOLDER}
        rendered = self._render([*[_plain(m) for m in history], turn], False)
        at = rendered.rfind(PLACEHOLDER)
        if at < 0:
            raise SetupError(
                "the chat template does not write an assistant turn's content: a teacher with "
                "another tokenizer needs one that does (teacher.tokenizer.chat_template)"
            )
        return _through_eos(rendered[at + len(PLACEHOLDER) :], self.tokenizer.eos_token)

    def _render(self, messages: list[Message], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages,
            tools=self.tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )

    def _encode(self, text: str) -> list[int]:
        return self._encode_many([text])[0]

    def _encode_many(self, texts: list[str]) -> list[list[int]]:
        return encode_texts(self.tokenizer, texts)


def encode_unique(
    tokenizer: PreTrainedTokenizerBase, texts: list[str], progress: CountProgress | None = None
) -> list[list[int]]:
    """encode_texts with each distinct text encoded once (each text still gets a list of its
    own), ENCODE_CHUNK distinct texts per call, `progress` told after each."""
    unique = list(dict.fromkeys(texts))
    ids = {}
    if progress is not None:
        progress.update(0, len(unique))
    for start in range(0, len(unique), ENCODE_CHUNK):
        chunk = unique[start : start + ENCODE_CHUNK]
        ids.update(zip(chunk, encode_texts(tokenizer, chunk), strict=True))
        if progress is not None:
            progress.update(len(ids), len(unique))
    if progress is not None:
        progress.finish(len(unique))
    return [list(ids[text]) for text in texts]


def encode_in_background(
    tokenizer: PreTrainedTokenizerBase, texts: list[str], progress: CountProgress | None = None
) -> Callable[[], list[list[int]]]:
    """encode_unique in a thread of its own: a fast tokenizer's Rust code runs without holding
    Python's GIL, so the encoding goes on beside the calling thread's own work. The returned
    function waits for it and returns the ids (raising what the encoding raised). The caller
    must not use the tokenizer until then."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encode-prompts")
    try:
        future = pool.submit(encode_unique, tokenizer, texts, progress)
    finally:
        pool.shutdown(wait=False)
    return future.result


def _store_quietly(cache: PromptCache, key: str, ids: list[list[int]]) -> None:
    """cache.store, a folder that cannot be written told in one line (the run goes on)."""
    try:
        cache.store(key, ids)
    except OSError as error:
        print(wrapped(f"data: the prompts' token ids not cached ({error}); each run encodes them"))


def _version(package: str) -> str | None:
    """The installed version of `package`, None when it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _with_token_ids(openings: list[list[Message]], ids: list[list[int]]) -> list[list[Message]]:
    """Each opening's messages with their token ids (`ids`: one list per message, in order)."""
    token_ids = iter(ids)
    return [[dict(m, token_ids=next(token_ids)) for m in messages] for messages in openings]


def encode_texts(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[list[int]]:
    """The token ids of each text, no special tokens added, none cut. A fast tokenizer's Rust
    backend encodes the batch itself where transformers would call it the same way (no
    truncation or padding set on it; special-token strings read as transformers' call reads
    them, which sets the backend's flag on every call and leaves it so: an earlier call with
    split_special_tokens=True would otherwise split them here): the same ids without offsets
    or a BatchEncoding, in half the time (a second of start-up per 50,000 prompts)."""
    if not texts:
        return []
    backend = getattr(tokenizer, "backend_tokenizer", None)
    direct = (
        getattr(tokenizer, "is_fast", False)
        and backend is not None
        and backend.truncation is None
        and backend.padding is None
    )
    if not direct:
        return tokenizer(texts, add_special_tokens=False)["input_ids"]
    split = bool(getattr(tokenizer, "split_special_tokens", False))
    if backend.encode_special_tokens != split:
        backend.encode_special_tokens = split
    return [encoding.ids for encoding in backend.encode_batch_fast(texts, add_special_tokens=False)]


PLACEHOLDER = "NEMOOPDCONTENT"
"""Stands for an assistant turn's content where only the template's own text around it is
wanted: no whitespace to trim, no markup to rewrite."""


def _through_eos(text: str, eos: str | None) -> str:
    """`text` cut after its first EOS token (the template's end-of-turn text after it is what
    the next turn's rendering adds)."""
    if eos and eos in text:
        return text[: text.index(eos) + len(eos)]
    return text


def _plain(message: Message) -> Message:
    """What the chat template reads: role and content (and a tool result's tool name)."""
    plain = {"role": message["role"], "content": message["content"]}
    if "name" in message:
        plain["name"] = message["name"]
    return plain


def _check_prompt_template(template: str) -> None:
    """A user-prompt template has one "{}" for the prompt and only doubled literal braces
    (nemo_opd.config.templates; the config's checks ran the same when it loaded)."""
    problem = template_problem(template, None)
    if problem:
        raise SetupError(f"data.prompt_file: the template {problem}")


def read_text_file(path: str | None, key: str) -> str | None:
    """The contents of a UTF-8 prompt file (named by config key `key`), or None when no path is
    configured. Raises SetupError for a missing file or one that is not UTF-8."""
    if path is None:
        return None
    return read_user_file(path, key, read_utf8).strip("\n")
