"""troupe: agents and RL post-training as short programs over graphs of Ray actors.

Programmatic use::

    from troupe import Run

    with Run("grpo", preset="smoke") as run:
        metrics = run.step()
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Run", "run", "__version__"]


def __getattr__(name: str) -> Any:
    # Lazy: `import troupe` stays cheap for the CLI and for Ray workers.
    if name in ("Run", "run"):
        from troupe.platform import driver

        return getattr(driver, name)
    raise AttributeError(f"module 'troupe' has no attribute {name!r}")
