"""The shape every algorithm has: a typed config, a graph of roles, a `step`.

An algorithm is a short single-controller program. The driver (`troupe.platform.driver`)
builds it (``__init__`` checks the input), calls `prepare` (slow work in the driver, timed),
creates the roles it declares, calls `setup`, then `step` once per iteration, `evaluate`
every ``run.eval_every`` steps, `save`/`load` for checkpoints and `--resume`, and at the end
`report`, which reads only the run directory::

    class MyAlgo(Algorithm):         # registered as a `troupe.algorithms` entry point
        Config = MyConfig            # a dataclass with a `run: RunConfig` field

        def roles(self):             # what to place on the cluster
            return [Role("learner", LearnerActor, num_cpus=1, kwargs=...)]

        def step(self, step):        # one iteration; returns metrics
            ...

        @classmethod
        def report(cls, config, run, history):   # summary and sections, from files alone
            return Report(summary={...}, sections=["## My result ..."])
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from troupe.platform.placement import ActorGraph, Role
    from troupe.platform.run import RunContext


@dataclasses.dataclass
class Report:
    """What an algorithm adds to a run's report: final figures for ``summary.json`` and
    Markdown sections that open ``report.md`` (its result and claims, before the plots)."""

    summary: dict[str, Any] = dataclasses.field(default_factory=dict)
    sections: list[str] = dataclasses.field(default_factory=list)


class Algorithm:
    """Base class of a registered algorithm."""

    Config: ClassVar[type]
    #: one-line description shown by `troupe list`
    summary_line: ClassVar[str] = ""
    #: False for an algorithm whose roles are all in the driver: no Ray cluster is started
    needs_ray: ClassVar[bool] = True
    #: metrics the progress bar shows, when a step or evaluation logs them
    progress_metrics: ClassVar[tuple[str, ...]] = ()
    #: True for an algorithm whose step takes its rollouts with `PolicyGraph.rollout_at` and
    #: trains through `PolicyGraph.update_and_sync` (or starts and confirms the rollouts ahead
    #: itself): only those accept ``run.staleness > 0``
    generates_ahead: ClassVar[bool] = False

    def __init__(self, config: Any, ctx: RunContext) -> None:
        """Check the input and build what the step needs in the driver; nothing slow (that is
        `prepare`), no actors (those are `roles`)."""
        self.config = config
        self.ctx = ctx
        self.graph: ActorGraph | None = None

    def prepare(self) -> dict[str, Any]:
        """Slow work in the driver before any actor starts, such as fitting the SFT checkpoint
        RL starts from. The driver times it; the returned facts (JSON) are kept in the run
        directory as ``prepare.json`` for the report."""
        return {}

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

    def close(self) -> None:
        """Release anything not owned by the actor graph."""

    # -- the run directory ---------------------------------------------------------
    @classmethod
    def report(cls, config: Any, run: RunContext, history: list[dict[str, Any]]) -> Report:
        """The algorithm's part of the report, from the config, the run directory and the
        metric history alone: `troupe report RUN_DIR` rebuilds it with no live run, so
        whatever it needs is written to the run directory while the run goes (``prepare.json``,
        an algorithm's own files under ``run.artifact(...)``)."""
        return Report()

    @classmethod
    def presets_dir(cls) -> Path:
        """``presets/`` beside the module that defines the algorithm."""
        return Path(inspect.getfile(cls)).parent / "presets"
