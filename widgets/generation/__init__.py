"""Generation-only parts of widgets/ (the naming rule: README, Architecture)."""

__all__: list[str] = []
