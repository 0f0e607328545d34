"""Running the core for real: the background loop and the asyncio driver."""

__all__: list[str] = []
