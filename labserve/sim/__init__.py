"""Simulation: the real batching core on a virtual clock, with a model cost instead of a model."""

from labserve.sim.simulate import LinearCost, simulate

__all__ = ["LinearCost", "simulate"]
