"""Sampling parameter types that enforce SGLang's ranges (`SamplingParams.verify()`) and fp32.

Every sampler computes in fp32: a value that is not a finite fp32 number, or that rounds to a
subnormal or to 0, makes the sampler divide by ~0 or overflow, and the probabilities go
non-finite. These types reject such values where the request enters, naming the field
(pydantic reports the field; the rule says what is wrong).
"""

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator

FP32_MAX = 3.4028234663852886e38
FP32_MIN_NORMAL = 1.1754943508222875e-38
# The sampler divides a logit by repetition_penalty, then by temperature (>= 1e-6, below
# which sampling is greedy). With logits up to 1e6 in magnitude (far beyond what any model
# emits) and this floor, the quotient stays below 1e32, well inside fp32.
MIN_REPETITION_PENALTY = 1e-20
# SGLang's "whole vocabulary" top_k; anything larger means the same thing or overflows int32.
MAX_TOP_K = 1 << 30
MIN_SEED, MAX_SEED = -(1 << 63), (1 << 63) - 1


def _number(value: Any) -> Any:
    """JSON numbers only: pydantic would otherwise take true as 1.0 and "0.5" as 0.5."""
    if isinstance(value, (bool, str)):
        raise ValueError("must be a number")
    return value


def _fp32(value: float) -> float:
    if not math.isfinite(value) or abs(value) > FP32_MAX:
        raise ValueError(f"must be a finite fp32 number (|x| <= 3.4e38), got {value}")
    if value != 0.0 and abs(value) < FP32_MIN_NORMAL:
        raise ValueError(f"is too close to 0 to compute in fp32 (use 0 or |x| >= 1.2e-38), "
                         f"got {value}")
    return value


def _between(lo: float, hi: float, *, lo_open: bool = False) -> Any:
    def check(value: float) -> float:
        if value < lo or (lo_open and value == lo) or value > hi:
            left = "(" if lo_open else "["
            raise ValueError(f"must be in {left}{lo:g}, {hi:g}], got {value}")
        return value

    return check


def _temperature(value: float) -> float:
    if value < 0:
        raise ValueError(f"must be >= 0, got {value}")
    return value


def _repetition_penalty(value: float) -> float:
    if not MIN_REPETITION_PENALTY <= value <= 2.0:
        raise ValueError(
            f"must be in [{MIN_REPETITION_PENALTY:g}, 2] (1.0 = no penalty; a smaller value "
            f"overflows fp32 logits), got {value}")
    return value


def _top_k(value: int) -> int:
    if value != -1 and value < 1:  # SGLang's own words for it
        raise ValueError(f"must be -1 (disable) or at least 1, got {value}")
    if value > MAX_TOP_K:
        raise ValueError(f"must be at most {MAX_TOP_K} (-1: the whole vocabulary), got {value}")
    return value


def _seed(value: int) -> int:
    if not MIN_SEED <= value <= MAX_SEED:
        raise ValueError(f"must be a 64-bit signed integer, got {value}")
    return value


def _float(*rules: Any) -> Any:
    return Annotated[float, BeforeValidator(_number), AfterValidator(_fp32),
                     *(AfterValidator(r) for r in rules)]


def _int(rule: Any) -> Any:
    return Annotated[int, BeforeValidator(_number), AfterValidator(rule)]


Temperature = _float(_temperature)
TopP = _float(_between(0.0, 1.0, lo_open=True))
MinP = _float(_between(0.0, 1.0))
Penalty = _float(_between(-2.0, 2.0))  # frequency_penalty, presence_penalty
RepetitionPenalty = _float(_repetition_penalty)
TopK = _int(_top_k)
Seed = _int(_seed)
