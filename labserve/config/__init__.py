"""The configs: the frozen, validated batching and generation settings, and the YAML file."""

__all__: list[str] = []
