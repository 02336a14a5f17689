"""Chat templates a built model directory may carry.

`chatml` (the default, `tokenizer.CHAT_TEMPLATE`) is what every existing test model uses. `qwen3`
is Qwen3's template in its real format, reduced to what this project needs: `tools` rendered
into the system turn as `<tools>` JSON lines, assistant tool calls as
`<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`, tool results as
`<tool_response>` user turns, and a thinking block the model writes as
`<think>\\n...\\n</think>\\n\\n` (`enable_thinking: false` pre-fills an empty one, so the model
answers directly). Without tools and thinking variables a chat renders exactly as `chatml`
does.

As in Qwen3's tokenizer, the four markers are added tokens (not special: they decode as text),
one id each: Dynamo's frontend parsers find a marker only when it arrives whole in one
detokenized delta. The vocabulary grows by four, so a `qwen3` build has weights of its own;
`chatml` builds are unchanged.
"""

from components.model_builder.tokenizer import CHAT_TEMPLATE

_CONTENT = (
    "{%- macro text(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content -%}{%- for part in content -%}{{ part['text'] }}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
)

_TOOLS_SYSTEM = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0]['role'] == 'system' -%}{{- text(messages[0]['content']) + '\\n\\n' -}}"
    "{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' -}}"
    "{%- endif -%}"
)

_TOOL_CALLS = (
    "{%- for call in message['tool_calls'] -%}"
    "{%- set fn = call['function'] if call['function'] is defined else call -%}"
    "{{- '\\n' if (loop.first and text(message['content'])) or not loop.first else '' -}}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' -}}"
    "{{- fn['arguments'] if fn['arguments'] is string else (fn['arguments'] | tojson) -}}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
)

_MESSAGES = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' and loop.first and tools -%}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + text(message['content']) -}}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] -%}" + _TOOL_CALLS +
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}"
    "{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + text(message['content']) + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}"
    "{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + text(message['content']) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)

_GENERATION = (
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)

QWEN3_TEMPLATE = _CONTENT + _TOOLS_SYSTEM + _MESSAGES + _GENERATION

TEMPLATES = {"chatml": CHAT_TEMPLATE, "qwen3": QWEN3_TEMPLATE}
ADDED_TOKENS = {"chatml": [], "qwen3": ["<tool_call>", "</tool_call>", "<think>", "</think>"]}
