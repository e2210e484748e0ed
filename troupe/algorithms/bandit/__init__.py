"""Batched linear bandits with one bit of feedback per batch; importing registers `bandit`."""

from troupe.algorithms.bandit import algorithm  # noqa: F401  (registers the algorithm)
