"""Environments and datasets; importing this package registers them and their rewards."""

from troupe.envs import arithmetic, datasets, iv_population, linear_bandit, video_qa  # noqa: F401
from troupe.platform.registry import REWARDS

# BPO's behaviour reward lives with its algorithm; named here so a reward actor finds it.
REWARDS.register_lazy("bpo_behavior", "troupe.algorithms.bpo.behavior:behavior_reward")
