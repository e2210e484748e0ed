"""The fault tests' shared pieces (a plugin of tests/conftest.py): the fault benchmark's module,
whose injections and comparisons the tests use, and the one uninterrupted GRPO run that the fault
table's tests (tests/algorithms/test_fault_table.py) and the node-loss tests
(tests/cluster/test_node_loss.py) compare their metrics with."""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What the tests add to the fault benchmark's config: a smaller step (4 prompts × 4 samples).
SMOKE = ["grpo.prompts_per_step=4", "rollout.sampling.max_new_tokens=24"]


@functools.cache
def faults_benchmark() -> ModuleType:
    """benchmarks/faults.py as a module: the fault tests inject, and compare, with its helpers.
    Kept out of sys.modules: Ray then pickles its classes (an engine wrapped to straggle) by value,
    since a worker could not import them by that name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("faults_benchmark", ROOT / "benchmarks" / "faults.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def fault_reference(ray_local, troupe_cache, tmp_path_factory):
    """The uninterrupted GRPO run every fault test compares its metrics with, made once a
    session: the fault benchmark's config (each role in a process of its own) at smoke size.
    ``overrides`` is that config (the benchmark's and `SMOKE`), ``rows`` the run's comparable rows and ``path`` a JSON file of them (what
    ``benchmarks/faults.py --reference`` reads)."""
    import json
    from types import SimpleNamespace

    from troupe import Run

    faults = faults_benchmark()
    overrides = [*faults.OVERRIDES, *SMOKE]
    work = tmp_path_factory.mktemp("fault-reference")
    with Run("grpo", preset="smoke", overrides=overrides, out=work / "run") as run:
        assert run.run()["faults"] == 0
    rows = faults.comparable_rows(work / "run")
    (work / "rows.json").write_text(json.dumps(rows))
    return SimpleNamespace(overrides=overrides, rows=rows, path=work / "rows.json")
