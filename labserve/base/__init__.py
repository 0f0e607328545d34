"""The ground floor: words, errors and clocks that every other layer imports down to."""

__all__: list[str] = []
