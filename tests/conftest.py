"""Shared fixtures: one private local Ray cluster for the whole test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def ray_local():
    """A private local Ray cluster (address="local" never joins a `ray start` cluster)."""
    import ray

    # Workers import test modules by name (actor classes and reward functions defined in tests).
    here = Path(__file__).parent
    dirs = sorted({str(p.parent) for p in here.rglob("test_*.py")})
    os.environ["PYTHONPATH"] = os.pathsep.join([*dirs, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    yield ray
    ray.shutdown()


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny Qwen2-style model and locally trained tokenizer saved to disk (untrained weights)."""
    from troupe.actors.models import TinyLMSpec, build_tiny_lm, save_model, train_tokenizer
    from troupe.envs.arithmetic import ArithmeticTask

    path = tmp_path_factory.mktemp("tiny-model")
    tok = train_tokenizer(ArithmeticTask().corpus(500))
    save_model(build_tiny_lm(TinyLMSpec(), tok, seed=0), tok, path)
    return str(path)


@pytest.fixture(scope="session")
def troupe_cache(tmp_path_factory):
    """A private SFT cache for the session (so tests never read a user's ~/.cache/troupe)."""
    path = tmp_path_factory.mktemp("troupe-cache")
    old = os.environ.get("TROUPE_CACHE")
    os.environ["TROUPE_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("TROUPE_CACHE", None)
    else:
        os.environ["TROUPE_CACHE"] = old
