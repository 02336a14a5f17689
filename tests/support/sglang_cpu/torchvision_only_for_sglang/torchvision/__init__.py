"""Exists only to run SGLang on CPU in tests: stands in for torchvision, whose registry build links CUDA.

SGLang's config package imports `torchvision.transforms` for multimodal configs the text models
never use; these names satisfy that import and fail loudly if anything really calls them.
"""
