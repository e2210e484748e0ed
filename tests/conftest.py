"""Shared fixtures: one private local Ray cluster for the whole test session.

A test that starts or joins Ray is marked ``ray`` here, by what it uses (the ``ray_local``
fixture, directly or through another fixture; the ``cluster`` marker; a place under
tests/cluster/), so ``pytest -m "not ray"`` is the fast inner loop. The mark is kept honest:
``ray.init`` raises in a test that is not marked ``ray``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

pytest_plugins = ["fault_fixtures"]  # tests/fault_fixtures.py: the fault tests' shared uninterrupted run

TESTS = Path(__file__).resolve().parent
UNMARKED_RAY_INIT = "this test starts Ray: use the ray_local fixture so it is marked 'ray'"


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


def needs_ray(item: pytest.Item) -> bool:
    """Whether a test starts or joins a Ray cluster, judged by what it declares."""
    return ("ray_local" in getattr(item, "fixturenames", ()) or item.get_closest_marker("cluster") is not None
            or TESTS / "cluster" in Path(str(item.path)).resolve().parents)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if needs_ray(item):
            item.add_marker(pytest.mark.ray)
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _refuse_ray_init(*_: Any, **__: Any) -> None:
    raise RuntimeError(UNMARKED_RAY_INIT)


class _GuardRayOnImport(importlib.abc.MetaPathFinder):
    """Replaces ``ray.init`` as soon as ``ray`` is imported, so that a test not marked ``ray``
    pays nothing for the guard unless it imports Ray itself."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "ray":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader, monkeypatch = spec.loader, self.monkeypatch

        class GuardingLoader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> ModuleType | None:
                return loader.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                module.__loader__ = module.__spec__.loader = loader  # the real loader from here on
                loader.exec_module(module)
                monkeypatch.setattr(module, "init", _refuse_ray_init)

        spec.loader = GuardingLoader()
        return spec


@pytest.fixture(autouse=True)
def _ray_init_only_where_marked(request, monkeypatch):
    """``ray.init`` raises in a test not marked ``ray`` (an unmarked test that starts Ray would
    make the inner loop slow without saying why)."""
    if request.node.get_closest_marker("ray") is not None:
        yield
        return
    ray = sys.modules.get("ray")
    if ray is not None:
        monkeypatch.setattr(ray, "init", _refuse_ray_init)
        yield
        return
    guard = _GuardRayOnImport(monkeypatch)
    sys.meta_path.insert(0, guard)
    try:
        yield
    finally:
        sys.meta_path.remove(guard)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny Qwen2-style model and locally trained tokenizer saved to disk (untrained weights)."""
    from troupe.actors.models import TinyLMSpec, build_tiny_lm, save_model, train_tokenizer
    from troupe.envs.arithmetic import ArithmeticTask

    path = tmp_path_factory.mktemp("tiny-model")
    tok = train_tokenizer(ArithmeticTask().corpus(500))
    save_model(build_tiny_lm(TinyLMSpec(), tok, seed=0), tok, path)
    return str(path)


@pytest.fixture
def replay_first_rollout(ray_local):
    """A function of an open GRPO `Run`: step 0's rollout replayed before the step runs, with the
    same weights, prompts and seed, as (the rollout, its batch); what step 0 trains on."""

    def replay(run):
        from troupe.algorithms.policy_graph import group_rows, step_seed
        from troupe.platform.batch import Batch

        algo, c = run.algo, run.config
        prompts, rows, _ = group_rows(algo.sample_prompts(0), c.grpo.group_size)
        out = algo.policy.rollout(prompts, rows, c.rollout.sampling, step_seed(c.run.seed, 0, "sample")).result()
        return out, Batch.concat(ray_local.get(out.batches))

    return replay


@pytest.fixture
def resume_from_checkpoint(ray_local):
    """A function ``(algorithm, run_dir, dest, step) -> dest``: a copy of a finished run whose
    checkpoints after ``step`` are removed, as a run killed before its next checkpoint leaves
    it, resumed to the end (asserting it resumed at ``step``)."""

    def resume(algorithm: str, run_dir: Path, dest: Path, step: int) -> Path:
        import shutil

        from troupe import Run

        shutil.copytree(run_dir, dest)
        for ckpt in (dest / "checkpoints").glob("step-*"):
            if int(ckpt.name.removeprefix("step-")) > step:
                shutil.rmtree(ckpt)
        (dest / "checkpoints" / "latest").write_text(f"step-{step:08d}\n")
        with Run(algorithm, resume=dest) as r:
            assert r.step_index == step
            r.run()
        return dest

    return resume


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
