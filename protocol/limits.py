"""Numeric bounds shared by the wire types and the handlers."""

# Upper bound for max_tokens / max_completion_tokens. No model this component serves has a
# context near 2**20 (1,048,576) tokens, so a larger value is a client bug or an overflow
# attempt (engines size int32/int64 buffers from it); it is rejected with a 400 instead of
# reaching the engine.
MAX_TOKENS_LIMIT = 1 << 20

# Bootstrap rooms are positive 63-bit integers: SGLang keys transfers by room in int64
# tensors and uses room 0 as "no room" in health checks.
MIN_BOOTSTRAP_ROOM = 1
MAX_BOOTSTRAP_ROOM = (1 << 63) - 1

# A choice count above this is a mistake (each choice is a full sequence in the engine).
MAX_CHOICES = 128

# top_logprobs / logprobs: alternatives per generated token (OpenAI's limit for top_logprobs).
MAX_TOP_LOGPROBS = 20
