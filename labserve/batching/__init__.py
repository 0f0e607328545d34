"""The sans-IO batching core: the queue, its strategies and the estimates they use."""

__all__: list[str] = []
