"""A package, so that pytest ends its package-scoped Ray right after these tests."""
