"""BPO: Behavior Pack Optimization (ALGORITHMS.md §A)."""

from troupe.algorithms.bpo.algorithm import BPO

__all__ = ["BPO"]
