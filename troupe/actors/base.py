"""What every troupe actor does first: size torch's thread pool from the CPUs it was given."""

from __future__ import annotations

import os


def configure_threads() -> int:
    """Use the thread count the placement layer put in the environment (whole CPUs, >= 1)."""
    n = int(os.environ.get("TROUPE_TORCH_THREADS", "0") or 0)
    if n > 0:
        import torch

        torch.set_num_threads(n)
    return n
