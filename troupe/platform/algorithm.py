"""The shape every algorithm has: a typed config, a graph of roles, a `step`.

An algorithm is a short single-controller program. The driver (`troupe.platform.driver`)
creates the roles it declares, calls `setup`, then `step` once per iteration, `evaluate`
every ``run.eval_every`` steps, and `save`/`load` for checkpoints and `--resume`::

    @ALGORITHMS.register("my_algo")
    class MyAlgo(Algorithm):
        Config = MyConfig            # a dataclass with a `run: RunConfig` field

        def roles(self):             # what to place on the cluster
            return [Role("learner", LearnerActor, num_cpus=1, kwargs=...)]

        def step(self, step):        # one iteration; returns metrics
            ...
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from troupe.platform.placement import ActorGraph, Role
    from troupe.platform.run import RunContext


class Algorithm:
    """Base class of a registered algorithm."""

    name: ClassVar[str] = ""
    Config: ClassVar[type]
    #: one-line description shown by `troupe list`
    summary_line: ClassVar[str] = ""

    def __init__(self, config: Any, ctx: RunContext) -> None:
        self.config = config
        self.ctx = ctx
        self.graph: ActorGraph | None = None

    # -- the graph ---------------------------------------------------------------
    def roles(self) -> list[Role]:
        """The actors this algorithm needs; the platform places and creates them."""
        return []

    def setup(self, graph: ActorGraph) -> None:
        """Called once the actors exist (and before `load` on resume)."""
        self.graph = graph

    # -- the loop ----------------------------------------------------------------
    def step(self, step: int) -> dict[str, float]:
        """One iteration; ``step`` counts from 0. Returns scalar metrics."""
        raise NotImplementedError

    def evaluate(self, step: int) -> dict[str, float]:
        """Held-out metrics, logged with an ``eval/`` prefix."""
        return {}

    # -- state -------------------------------------------------------------------
    def save(self, ckpt_dir: Path) -> None:
        """Write everything a resumed run needs (weights, optimizer) into ``ckpt_dir``."""

    def load(self, ckpt_dir: Path) -> None:
        """Restore what `save` wrote."""

    # -- the run directory ---------------------------------------------------------
    def finalize(self, history: list[dict[str, Any]]) -> dict[str, Any]:
        """Final figures for ``summary.json`` (the driver adds the last metrics itself)."""
        return {}

    def report_sections(self, summary: dict[str, Any]) -> list[str]:
        """Extra Markdown sections for ``report.md`` (tables, comparisons)."""
        return []

    def close(self) -> None:
        """Release anything not owned by the actor graph."""

    @classmethod
    def presets_dir(cls) -> Path:
        """``presets/`` beside the module that defines the algorithm."""
        return Path(inspect.getfile(cls)).parent / "presets"
