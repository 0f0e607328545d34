"""Generation on Ray Serve: what only generative methods need beside the request path."""

__all__: list[str] = []
