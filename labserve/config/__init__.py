"""The batching config: the frozen, validated settings and the YAML file that layers them."""

__all__: list[str] = []
