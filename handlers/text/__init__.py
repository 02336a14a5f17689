"""Text mode: the OpenAI chat request the worker handles itself (docs/reference/input-modes.md):
chat template and tokenization off the loop, the template's kwargs and time budget, tools and
reasoning in the output, and engine chunks -> `chat.completion.chunk` dicts."""
