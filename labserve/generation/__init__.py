"""Continuous batching for generative models: the sans-IO scheduler and its words."""

__all__: list[str] = []
