from troupe.algorithms.grpo.algorithm import GRPO
from troupe.algorithms.grpo.config import GRPOConfig

__all__ = ["GRPO", "GRPOConfig"]
