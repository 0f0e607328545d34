"""Recording traffic and reading it back: the recorder, snapshots, Prometheus export."""

__all__: list[str] = []
