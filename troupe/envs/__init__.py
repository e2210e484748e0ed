"""Environments and datasets; importing this package registers them and their rewards."""

from troupe.envs import arithmetic, datasets, iv_population, linear_bandit  # noqa: F401
