"""Generation-only parts of lab/ (the naming rule: README, Architecture)."""

__all__: list[str] = []
