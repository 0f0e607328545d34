"""Generation-only parts of runtime/ (the naming rule: README, Architecture)."""

__all__: list[str] = []
