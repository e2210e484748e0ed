"""The driver: one `Run` creates the run directory and the actor graph, steps the algorithm,
evaluates, checkpoints, and writes the report. It is also the programmatic API::

    from troupe import Run

    with Run("grpo", preset="smoke", overrides=["run.steps=4"]) as run:
        for _ in range(4):
            print(run.step()["reward/mean"])
        print(run.evaluate())
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from troupe.platform import config as cfglib
from troupe.platform.algorithm import Algorithm
from troupe.platform.checkpoint import CheckpointDir, atomic_write_json
from troupe.platform.errors import ConfigError
from troupe.platform.metrics import MetricsLog, read_metrics
from troupe.platform.placement import ActorGraph
from troupe.platform.registry import ALGORITHMS
from troupe.platform.report import record_resume, resume_counts, write_report
from troupe.platform.run import RunContext
from troupe.platform.storage import RemoteRunDir, is_uri, join, staging_dir
from troupe.platform.trackers import build_trackers

log = logging.getLogger("troupe")


def algorithm_class(name: str) -> type[Algorithm]:
    return ALGORITHMS.get(name)


def resolve_config(name: str, preset: str | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Any:
    cls = algorithm_class(name)
    return cfglib.resolve(cls.Config, cls.presets_dir(), preset, list(overrides))


def check_staleness(name: str, cls: type[Algorithm], staleness: int) -> None:
    """``run.staleness > 0`` only for an algorithm that generates ahead of its update: elsewhere
    it would be silently ignored."""
    if staleness > 0 and not cls.generates_ahead:
        able = sorted(n for n in ALGORITHMS.names() if algorithm_class(n).generates_ahead)
        raise ConfigError(f"run.staleness={staleness}: {name}'s step does not generate ahead of its update "
                          f"(the algorithms that do: {', '.join(able)}); set run.staleness=0")


# Files a run directory holds from its first step: their presence means the directory is taken.
RUN_FILES = ("config.yaml", "metrics.jsonl")


class Run:
    """One run of one algorithm: config → run directory → actor graph → steps → report."""

    def __init__(
        self,
        algorithm: str,
        preset: str | None = None,
        overrides: list[str] | tuple[str, ...] = (),
        out: str | Path | None = None,
        resume: str | Path | None = None,
        config: Any = None,
    ) -> None:
        self.name = algorithm
        self.cls = algorithm_class(algorithm)
        # A run kept at a URI works in a local copy (run_dir) that `remote` mirrors to `location`.
        self.remote: RemoteRunDir | None = None
        self.resume_dir = Path(resume) if resume and not is_uri(resume) else None
        if resume and is_uri(resume):
            self.remote = RemoteRunDir(str(resume))
            if not self.remote.has("config.yaml"):
                raise ConfigError(f"--resume {str(resume)!r}: no config.yaml there; is it a troupe run directory?")
            self.resume_dir = self.remote.pull(staging_dir(algorithm), checkpoints="latest")
        if self.resume_dir is not None:
            self.config = self._config_from_run_dir(self.resume_dir, overrides)
            self.run_dir = self.resume_dir
        else:
            if config is not None:
                self.config = config
            else:
                self.config = resolve_config(algorithm, preset, overrides)  # checks the registered names itself
            where = str(out) if out else self._new_run_dir()
            if is_uri(where):
                self.remote = RemoteRunDir(where)
                self.run_dir = staging_dir(algorithm)
                held = [name for name in RUN_FILES if self.remote.has(name)]
            else:
                self.run_dir = Path(where)
                held = [name for name in RUN_FILES if (self.run_dir / name).exists()]
            if held:
                # A second run there would append to the first's metrics and leave its evaluations beside its own.
                raise ConfigError(f"--out {where!r} already holds a run ({', '.join(held)}); pass --resume {where} "
                                  "to continue it, or another --out (or delete the directory) for a new run")
        self.location = self.remote.uri if self.remote else str(self.run_dir)
        if self.resume_dir is not None or config is not None:
            # Unknown names (a loss, a task, a backend) fail here, before any actor starts.
            cfglib.check_registered(self.config)
        rc = self.config.run
        check_staleness(algorithm, self.cls, rc.staleness)
        self.trackers = build_trackers(rc.trackers)  # a missing wandb or mlflow fails here too
        self.ctx = RunContext(run_dir=self.run_dir, seed=rc.seed, call_timeout_s=rc.call_timeout_s)
        self.step_index = 0
        self.algo: Algorithm | None = None
        self.graph: ActorGraph | None = None
        self.metrics: MetricsLog | None = None
        self.faults = 0
        self._last_eval: int | None = None
        self._last_checkpoint: int | None = None
        self._started_ray = False
        self._local_cluster = False  # Ray started here, a cluster of this machine alone: nothing can grow
        self._t0 = time.monotonic()
        self._last_push = self._t0

    # -- setup -------------------------------------------------------------------
    def _config_from_run_dir(self, run_dir: Path, overrides: list[str] | tuple[str, ...]) -> Any:
        path = run_dir / "config.yaml"
        if not path.is_file():
            raise ConfigError(f"--resume {str(run_dir)!r}: no config.yaml there; is it a troupe run directory?")
        data = cfglib.load_yaml(path)
        for text in overrides:  # e.g. run.steps=200 to extend a finished run
            data = cfglib.merge(data, cfglib.parse_override(text))
        return cfglib.from_dict(self.cls.Config, data)

    def _new_run_dir(self) -> str:
        """``run.out/<algorithm>-<time>``, with a suffix when that name is taken."""
        out = self.config.run.out
        base = join(out, f"{self.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        taken = (lambda w: RemoteRunDir(w).exists()) if is_uri(out) else (lambda w: Path(w).exists())
        where, i = base, 1
        while taken(where):
            where, i = f"{base}-{i}", i + 1
        return where

    def start(self) -> Run:
        """Create the run directory and the graph; restore the last checkpoint on resume."""
        rc = self.config.run
        self.run_dir.mkdir(parents=True, exist_ok=True)
        cfglib.save_yaml(cfglib.to_dict(self.config), self.run_dir / "config.yaml")
        self._warn_if_job_temporary()
        self._push(force=True)  # the URI shows the run (its config) from its first second
        _seed_everything(rc.seed)
        try:
            self.metrics = MetricsLog(self.run_dir, self.trackers, cfglib.to_dict(self.config),
                                      resume=self.resume_dir is not None)
            # Bad data paths, models or names fail here, before any cluster starts.
            self.algo = self.cls(self.config, self.ctx)
            self._prepare()
            self._init_ray(rc)
            self.graph = ActorGraph(self.algo.roles(), rc.placement_timeout_s, rc.call_timeout_s,
                                    node_types=rc.node_types, request_resources=rc.request_resources,
                                    can_grow=False if self._local_cluster else None,
                                    fuse=rc.fuse_roles).start()
            self.algo.setup(self.graph)
            if self.resume_dir is not None:
                self._restore()
        except BaseException:
            self.close()
            raise
        return self

    def _prepare(self) -> None:
        """The algorithm's slow work in the driver (e.g. the SFT checkpoint), timed and kept."""
        t = time.perf_counter()
        facts = self.algo.prepare()
        seconds = round(time.perf_counter() - t, 2)
        if facts or seconds >= 0.5:
            log.info("%s: prepared in %.1fs: %s", self.name, seconds, facts)
        atomic_write_json(self.ctx.prepared_path, {**facts, "seconds": seconds})

    def _init_ray(self, rc: cfglib.RunConfig) -> None:
        if self.cls.needs_ray:
            import ray

            if not ray.is_initialized():
                kwargs: dict[str, Any] = {"configure_logging": False, "log_to_driver": True}
                if rc.address:
                    ray.init(address=rc.address, **kwargs)
                elif os.environ.get("RAY_ADDRESS"):  # inside `ray job submit`: join that cluster
                    ray.init(**kwargs)
                else:
                    ray.init(address="local", num_cpus=rc.num_cpus, include_dashboard=False, **kwargs)
                    self._local_cluster = True
                self._started_ray = True

    def _restore(self) -> None:
        """Restore the last complete checkpoint; with none (a run killed before or while writing
        its first one), start again from step 0 in the same directory. Either way, the temporary
        folders a crash mid-write left are removed and the resume is recorded for the report."""
        ckpts = CheckpointDir(self.ctx.checkpoints_dir)
        removed = ckpts.remove_partials()
        if removed:
            log.info("removed %d temporary checkpoint folder(s) left by a crash mid-write: %s",
                     len(removed), ", ".join(removed))
        ckpt = ckpts.latest()
        if ckpt is None:
            # What the killed run logged is redone from the start (its evaluation at 0 too).
            self.metrics.truncate_after(-1)
            self.ctx.resumed_from_step = 0
            log.warning("--resume %s: no complete checkpoint in %s; starting again from step 0 in the same "
                        "directory", self.run_dir, self.ctx.checkpoints_dir)
            record_resume(self.run_dir, 0, None, removed)
            return
        import json

        state = json.loads((ckpt / "driver.json").read_text())
        self.algo.load(ckpt)
        self.step_index = int(state["step"])
        self._last_checkpoint = self.step_index
        self.faults = int(state.get("faults", 0))
        _set_rng_state(state["rng"])
        self.metrics.truncate_after(self.step_index)
        self.ctx.resumed_from_step = self.step_index
        record_resume(self.run_dir, self.step_index, ckpt.name, removed)
        log.info("resumed %s at step %d from %s", self.name, self.step_index, ckpt)

    # -- the loop ------------------------------------------------------------------
    def step(self) -> dict[str, Any]:
        """Run one iteration (and the evaluation or checkpoint due after it); return its metrics.

        Training metrics are logged at the step's index; an evaluation is logged at the number
        of steps done when it ran (0 = before any training)."""
        rc = self.config.run
        t = time.perf_counter()
        metrics = dict(self.algo.step(self.step_index))
        metrics["time/step_s"] = time.perf_counter() - t
        self.faults += int(metrics.get("faults", 0))
        self.metrics.write(self.step_index, metrics)
        self.step_index += 1
        if rc.eval_every and self.step_index % rc.eval_every == 0:
            metrics.update(self.evaluate())
        if rc.checkpoint_every and self.step_index % rc.checkpoint_every == 0:
            self.checkpoint()
        else:
            self._push()
        return metrics

    def evaluate(self) -> dict[str, Any]:
        """Held-out metrics with an ``eval/`` prefix, logged at the number of steps done."""
        raw = self.algo.evaluate(self.step_index)
        out = {k if k.startswith("eval/") else f"eval/{k}": v for k, v in raw.items()}
        if out:
            self.metrics.write(self.step_index, out)
            self._last_eval = self.step_index
        return out

    def checkpoint(self) -> Path:
        def fill(tmp: Path) -> None:
            self.algo.save(tmp)
            atomic_write_json(tmp / "driver.json", {"step": self.step_index, "faults": self.faults,
                                                     "rng": _get_rng_state()})

        ckpts = CheckpointDir(self.ctx.checkpoints_dir)
        path = ckpts.write(self.step_index, fill)
        self._last_checkpoint = self.step_index
        if self.remote is not None:
            self.remote.push_checkpoint(path, keep=ckpts.names())
            self._push(force=True)  # the metrics and records that go with it
        return path

    def run(self) -> dict[str, Any]:
        """Every remaining step, a final evaluation and checkpoint, then the report."""
        rc = self.config.run
        from tqdm.auto import tqdm

        bar = tqdm(total=rc.steps, initial=self.step_index, desc=self.name, disable=not rc.progress,
                   dynamic_ncols=True)
        if self.step_index == 0 and rc.eval_every:
            self.evaluate()  # the starting point of every eval curve
        try:
            while self.step_index < rc.steps:
                m = self.step()
                bar.update(1)
                bar.set_postfix({k: f"{m[k]:.3g}" for k in self.cls.progress_metrics if k in m})
        finally:
            bar.close()
        if self._last_eval != self.step_index:
            self.evaluate()
        if self.step_index > 0 and self._last_checkpoint != self.step_index:
            self.checkpoint()
        return self.finish()

    def finish(self) -> dict[str, Any]:
        """Write ``summary.json``, plots and ``report.md``; return the summary."""
        history = read_metrics(self.run_dir / "metrics.jsonl")
        report = self.cls.report(self.config, self.ctx, history)
        summary = dict(report.summary)
        summary.setdefault("faults", self.faults)
        summary.update(resume_counts(self.run_dir))  # the --resumes of this run directory, restarts among them
        summary["wall_s"] = round(time.monotonic() - self._t0, 2)
        summary["run_dir"] = self.location
        write_report(self.run_dir, self.name, cfglib.to_dict(self.config), summary, report.sections)
        self._push(force=True)
        return summary

    # -- storage -------------------------------------------------------------------
    def _push(self, force: bool = False) -> None:
        """Mirror the local copy to the run's URI: always when ``force``, else at most every
        ``run.sync_every_s``."""
        if self.remote is None or not (force or time.monotonic() - self._last_push >= self.config.run.sync_every_s):
            return
        n = self.remote.push(self.run_dir)
        self._last_push = time.monotonic()
        log.debug("pushed %d files to %s", n, self.location)

    def _warn_if_job_temporary(self) -> None:
        """A Ray job's driver runs in a working directory the cluster deletes: say so when the
        run directory is inside it."""
        if self.remote is not None or "RAY_JOB_CONFIG_JSON_ENV_VAR" not in os.environ:
            return
        cwd = Path.cwd().resolve()
        if self.run_dir.resolve().is_relative_to(cwd) and "runtime_resources" in cwd.parts:
            log.warning("run directory %s is inside this Ray job's temporary working directory, which the "
                        "cluster may delete: set run.out (or --out) to shared storage or a URI "
                        "(s3://bucket/runs, gs://..., file:///mnt/shared/runs)", self.run_dir.resolve())

    # -- teardown ------------------------------------------------------------------
    def close(self) -> None:
        if self.algo is not None:
            try:
                self.algo.close()
            except Exception as e:  # teardown goes on; say what failed
                log.warning("closing %s failed: %s", self.name, e)
        if self.graph is not None:
            self.graph.shutdown()
            self.graph = None
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if self._started_ray:
            import ray

            ray.shutdown()
            self._started_ray = self._local_cluster = False
        if self.remote is not None and self.run_dir.exists():
            try:  # what the run wrote after its last push (the trackers' last records, a crash's metrics)
                self.remote.push(self.run_dir)
            except Exception as e:
                log.warning("the local copy %s could not be pushed to %s and is kept: %s",
                            self.run_dir, self.location, e)
            else:
                shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> Run:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def history(self) -> list[dict[str, Any]]:
        return read_metrics(self.run_dir / "metrics.jsonl")


def run(algorithm: str, preset: str | None = None, overrides: list[str] | tuple[str, ...] = (),
        out: str | Path | None = None, resume: str | Path | None = None) -> dict[str, Any]:
    """Run an algorithm to the end and return its summary (what `troupe run` does)."""
    with Run(algorithm, preset, overrides, out, resume) as r:
        return r.run()


def _seed_everything(seed: int) -> None:
    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
    if "torch" in sys.modules:  # algorithms that use torch have imported it; others skip its cost
        sys.modules["torch"].manual_seed(seed)


def _get_rng_state() -> dict[str, Any]:
    import numpy as np

    np_state = np.random.get_state()
    state = {
        "python": [list(x) if isinstance(x, tuple) else x for x in random.getstate()],
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
    }
    if "torch" in sys.modules:
        state["torch"] = sys.modules["torch"].get_rng_state().tolist()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np

    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    npst = state["numpy"]
    np.random.set_state((npst[0], np.array(npst[1], dtype=np.uint32), *npst[2:]))
    if "torch" in state:
        import torch

        torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
