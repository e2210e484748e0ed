"""Algorithms, registered by name through the ``troupe.algorithms`` entry points
(``pyproject.toml``); each module is imported only when its algorithm is asked for."""
