"""Exists only to run SGLang on CPU in tests: the import-time names of `torchvision.transforms`."""

from __future__ import annotations

import enum
from typing import Any



class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"


from torchvision.transforms import functional  # noqa: E402,F401  (SGLang's OCR config imports it)


class _Missing(AttributeError, NotImplementedError):
    """An AttributeError (so hasattr() and `from x import y` behave) that names the gap."""


def __getattr__(name: str) -> Any:
    raise _Missing(f"torchvision stand-in: transforms.{name} is not available in tests")
