"""Tokenizers and chat templates with tools, for the tests of tool turns.

- tools_tokenizer(): the tiny tool task's tokenizer (ChatML, tools offered in a system turn,
  <tool_call> and <tool_response> tokens), trained on a few records;
- qwen3_style(): the same vocabulary with a template that writes tools and tool results as
  Qwen3's does (the tools as JSON in <tools></tools>, consecutive results in one user turn,
  the last assistant turn after the last query with its <think> block);
- plain_style(): the same vocabulary with "### role:" headers instead of ChatML (tools and
  tool results under headers of their own);
- llama3_style(): the same vocabulary with Llama 3.1's header tokens and a template in its
  JSON tool-calling format (tools as JSON in the system turn, a call answered as the whole
  turn, results under the ipython header, every content trimmed).
"""

import copy

from nemo_opd.tiny.task import TinyMathConfig, build_tiny_math_splits
from nemo_opd.tiny.tokenizer import build_tiny_tokenizer
from nemo_opd.tiny.tool_task import corpus_texts

QWEN3_STYLE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nFunction signatures within <tools></tools>:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nCall one as <tool_call>\\n{"name": <name>, "arguments": <object>}\\n'
    + '</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(last_query=messages|length - 1, found=false) %}
{%- for message in messages[::-1] %}
{%- set index = messages|length - 1 - loop.index0 %}
{%- if not ns.found and message.role == 'user' %}
{%- set ns.found = true %}{%- set ns.last_query = index %}
{%- endif %}
{%- endfor %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{%- if loop.index0 > ns.last_query and loop.last %}
{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + message.content + '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>assistant\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
{{- '<|im_start|>user' }}
{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

PLAIN_STYLE = """\
{%- if tools %}
{{- '### tools: ' + (tools | map(attribute='function') | map(attribute='name') | join(', '))
    + '\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' %}
{{- '### assistant:\n' + message.content + '<|im_end|>\n' }}
{%- else %}
{{- '### ' + message.role + ':\n' + message.content + '\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '### assistant:\n' }}{%- endif %}
"""

LLAMA3_STYLE = """\
{{- bos_token }}
{%- if tools %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\nEnvironment: ipython\\n'
    + 'Answer a call with only {"name": <name>, "parameters": <object>}.\\n' }}
{%- for tool in tools %}{{- (tool | tojson) + '\\n' }}{%- endfor %}
{{- '<|eot_id|>' }}
{%- endif %}
{%- for message in messages %}
{%- set role = 'ipython' if message.role == 'tool' else message.role %}
{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + message.content | trim
    + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""


def tools_tokenizer():
    """The tiny tool task's tokenizer, trained on 400 records."""
    records = build_tiny_math_splits(TinyMathConfig(num_train=400, num_validation=10, seed=3))
    train = records["train"]
    return build_tiny_tokenizer(train, 400, 2, 256, "tools", corpus_texts(train))


def qwen3_style(tokenizer):
    """A copy of `tokenizer` with the Qwen3-style template."""
    styled = copy.deepcopy(tokenizer)
    styled.chat_template = QWEN3_STYLE
    return styled


def plain_style(tokenizer):
    """A copy of `tokenizer` with the "### role:" template."""
    styled = copy.deepcopy(tokenizer)
    styled.chat_template = PLAIN_STYLE
    return styled


def llama3_style(tokenizer):
    """A copy of `tokenizer` with Llama 3's header and end-of-turn tokens (eos <|eot_id|>,
    bos <|begin_of_text|>) and the Llama 3-style template."""
    styled = copy.deepcopy(tokenizer)
    styled.add_special_tokens(
        {
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot_id|>",
            "additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>"],
        }
    )
    styled.chat_template = LLAMA3_STYLE
    return styled
