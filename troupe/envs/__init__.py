"""Environments, tasks and datasets; each is registered through an entry-point group of
``pyproject.toml`` (``troupe.envs``, ``troupe.tasks``, ``troupe.rewards``)."""
