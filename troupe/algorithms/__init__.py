"""Algorithms; importing this package registers each of them."""

import importlib

# One module (or package) per algorithm; each registers itself with ALGORITHMS on import.
for _name in ("grpo",):
    importlib.import_module(f"troupe.algorithms.{_name}")
