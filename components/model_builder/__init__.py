"""Builds the small Hugging Face model the project runs on (no downloads needed)."""

from components.model_builder.build import SIZES, build_model_dir

__all__ = ["SIZES", "build_model_dir"]
