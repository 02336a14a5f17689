"""Exists only to run SGLang on CPU in tests: `torchvision.transforms.functional`, import only."""

from typing import Any

from torchvision.transforms import InterpolationMode  # noqa: F401  (re-exported, as torchvision does)


class _Missing(AttributeError, NotImplementedError):
    """An AttributeError (so hasattr() and `from x import y` behave) that names the gap."""


def __getattr__(name: str) -> Any:
    raise _Missing(f"torchvision stand-in: functional.{name} is not available in tests")
