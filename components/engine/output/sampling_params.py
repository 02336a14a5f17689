"""Per-request sampling parameters with SGLang's names, defaults and validation messages."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

SAMPLING_EPS = 1e-6
MAX_STOP_COUNT = 32

# Accepted by SGLang but not implemented here: a request that sets one gets a clear 400.
_UNSUPPORTED = ("stop_regex", "beam_width", "custom_params", "watermark")
# Grammar constraints (components/engine/output/grammar.py): at most one per request, as in SGLang.
_GRAMMARS = ("json_schema", "regex", "ebnf", "structural_tag")
_KNOWN = {
    "max_new_tokens", "min_new_tokens", "stop", "stop_token_ids", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "ignore_eos",
    "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "sampling_seed", "n",
    "stream_interval", "logit_bias", *_GRAMMARS, *_UNSUPPORTED,
}


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int | None = 128
    min_new_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: int | None = None
    n: int = 1
    stream_interval: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None

    @property
    def is_greedy(self) -> bool:
        # SGLang turns temperature ~0 into top_k=1.
        return self.temperature < SAMPLING_EPS or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)

    @classmethod
    def from_dict(cls, params: dict[str, Any] | None, vocab_size: int) -> "SamplingParams":
        """Validate a request's ``sampling_params`` dict; ValueError names the bad field."""
        if params is not None and not isinstance(params, dict):
            raise ValueError(f"sampling_params must be a dict, got {type(params).__name__}")
        params = dict(params or {})
        unknown = sorted(set(params) - _KNOWN)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s): {', '.join(unknown)}")
        for name in _UNSUPPORTED:
            if params.get(name) not in (None, "", [], {}):
                raise ValueError(f"sampling parameter {name!r} is not supported by the CPU engine")
        # SGLang treats an explicit None as "use the default".
        values = {k: v for k, v in params.items() if v is not None and k not in _UNSUPPORTED}
        kw: dict[str, Any] = {}
        for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
                     "repetition_penalty"):
            if name in values:
                kw[name] = _number(name, values[name])
        for name in ("max_new_tokens", "min_new_tokens", "top_k", "n", "stream_interval",
                     "sampling_seed"):
            if name in values:
                kw[name] = _integer(name, values[name])
        if "max_new_tokens" in params and params["max_new_tokens"] is None:
            kw["max_new_tokens"] = None
        for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
                     "no_stop_trim"):
            if name in values:
                if not isinstance(values[name], bool):
                    raise ValueError(f"{name} must be a boolean, got {values[name]!r}")
                kw[name] = values[name]
        if "stop" in values:
            kw["stop"] = _stop_strings(values["stop"])
        if "stop_token_ids" in values:
            kw["stop_token_ids"] = _token_set("stop_token_ids", values["stop_token_ids"],
                                              vocab_size)
        if "logit_bias" in values:
            kw["logit_bias"] = _logit_bias(values["logit_bias"], vocab_size)
        kw.update(_grammar(values))
        sp = cls(**kw)
        sp._verify()
        return sp

    def _verify(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0.0:
            raise ValueError(
                f"temperature must be a non-negative finite number, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        if self.top_k < 1 and self.top_k != -1:
            raise ValueError(f"top_k must be -1 (disable) or at least 1, got {self.top_k}.")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}.")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise ValueError(
                "repetition_penalty must be in (0, 2] (1.0 = no penalty), "
                f"got {self.repetition_penalty}."
            )
        if self.min_new_tokens < 0:
            raise ValueError(
                f"min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}.")
        if self.max_new_tokens is not None:
            if self.max_new_tokens < 0:
                raise ValueError(f"max_new_tokens must be at least 0, got {self.max_new_tokens}.")
            if self.min_new_tokens > self.max_new_tokens:
                raise ValueError(
                    f"min_new_tokens must be in [0, max_new_tokens({self.max_new_tokens})], "
                    f"got {self.min_new_tokens}."
                )
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        if self.stream_interval is not None and self.stream_interval < 1:
            raise ValueError(f"stream_interval must be at least 1, got {self.stream_interval}.")
        if self.sampling_seed is not None and not -(2**63) <= self.sampling_seed <= 2**63 - 1:
            raise ValueError(
                f"sampling_seed must be in [-2**63, 2**63 - 1], got {self.sampling_seed}.")


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    return float(value)


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer() and name != "sampling_seed":
            return int(value)
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return value


def _stop_strings(value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
        raise ValueError("stop must be a string or a list of strings")
    if len(items) > MAX_STOP_COUNT:
        raise ValueError(f"stop accepts at most {MAX_STOP_COUNT} strings, got {len(items)}")
    return tuple(s for s in items if s)


def _token_set(name: str, value: Any, vocab_size: int) -> frozenset[int]:
    if not isinstance(value, (list, tuple, set, frozenset)):
        raise ValueError(f"{name} must be a list of token ids")
    out = set()
    for t in value:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise ValueError(f"{name} must hold token ids in [0, {vocab_size - 1}], got {t!r}")
        out.add(t)
    return frozenset(out)


def _grammar(values: dict[str, Any]) -> dict[str, str]:
    # SGLang treats an empty string as unset.
    given = {k: values[k] for k in _GRAMMARS if values.get(k) not in (None, "")}
    for name, text in given.items():
        if not isinstance(text, str):
            raise ValueError(f"{name} must be a string, got {type(text).__name__}")
    if len(given) > 1:
        raise ValueError("Only one of json_schema, regex, ebnf, or structural_tag can be set.")
    return given


def _logit_bias(value: Any, vocab_size: int) -> dict[int, float]:
    if not isinstance(value, dict):
        raise ValueError("logit_bias must be a dict of token id -> bias")
    out = {}
    for k, v in value.items():
        try:
            tid = int(k)
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias keys must be token ids, got {k!r}") from None
        if not 0 <= tid < vocab_size:
            raise ValueError(f"logit_bias must have keys in [0, {vocab_size - 1}], got {tid}.")
        bias = _number("logit_bias value", v)
        if not math.isfinite(bias):
            raise ValueError(f"logit_bias values must be finite numbers, got {v!r} for {tid}")
        out[tid] = bias
    return out
