"""Fault injection at smoke scale: each fault troupe claims to survive, injected into a real
GRPO run, with whether the run survived and what was lost.

Every scenario runs in a process of its own (its own Ray cluster, temp dir and process tree),
and stops only what it started. ``tests/algorithms/test_fault_table.py`` and
``tests/cluster/test_node_loss.py`` run every scenario of the README's fault table at smoke
scale and compare each run's non-timing metrics with an uninterrupted one.

Scenarios (``--scenario NAME``):

- ``rollout_killed``: a rollout engine whose process exits inside its generate call;
- ``rollout_killed_before_sync``: a rollout engine killed after its generate returned, before
  the step's weight sync reaches it;
- ``rollout_straggler``: a rollout engine that stops answering (sleeps past the call timeout);
- ``reward_straggler``: the reward actor hangs in a step: a clear error, then ``--resume``;
- ``node_lost``: the worker node that hosts the rollout engine removed
  (``ray.cluster_utils.Cluster``), a spare node left;
- ``node_lost_no_spare``: the only node that can host the engine removed: a clear error,
  then a node is added back and ``--resume`` finishes;
- ``driver_killed_mid_checkpoint``: ``troupe run`` SIGKILLed while writing a checkpoint;
- ``driver_killed_mid_step``: ``troupe run`` SIGKILLed inside a step, after the learner's update.

"What was lost" compares the run's metrics (timings and the fault count aside) with an
uninterrupted run of the same config: the rows a killed driver wrote before it died, and, when
``--reference`` names one (the full benchmark makes it first), a whole uninterrupted run.
Writes ``benchmarks/results/faults.json`` and prints the Markdown table the README shows.

    python benchmarks/faults.py
    python benchmarks/faults.py --only rollout_killed,rollout_killed_before_sync   # the rest kept
    python benchmarks/faults.py --scenario node_lost --json /tmp/row.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STEPS = 4
CHECKPOINT_EVERY = 2
# Smoke scale: 8 prompts × 4 samples a step (enough that rewards, and so the updates, are
# rarely all zero, which would make any two runs look alike), 8 evaluation prompts every 2 steps.
# Each role in a process of its own, as on a cluster: a fused role is never restarted alone.
OVERRIDES = ["run.progress=false", "run.fuse_roles=false", f"run.steps={STEPS}", "run.eval_every=2", f"run.checkpoint_every={CHECKPOINT_EVERY}",
             "eval.num_prompts=8", "grpo.prompts_per_step=8", "grpo.group_size=4"]
GPU_NODE = {"num_cpus": 1, "num_gpus": 1, "object_store_memory": 128 * 1024**2}
HEAD_NODE = {"num_cpus": 2, "object_store_memory": 256 * 1024**2}
STRAGGLE_FLAG_ENV = "TROUPE_FAULTS_STRAGGLE_FLAG"

SCENARIOS: dict[str, Callable[[argparse.Namespace, Path], dict[str, Any]]] = {}


def scenario(name: str) -> Callable:
    """Register a scenario: a function of (args, work dir) that returns its table row."""

    def deco(fn: Callable[[argparse.Namespace, Path], dict[str, Any]]) -> Callable:
        SCENARIOS[name] = fn
        return fn

    return deco


# -- what a row says ---------------------------------------------------------------------------
def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    """A run's metrics rows."""
    from troupe.platform.metrics import read_metrics

    return read_metrics(Path(run_dir) / "metrics.jsonl")


def comparable_rows(run_dir: Path) -> list[dict[str, Any]]:
    """A run's metrics rows without what legitimately differs between runs: timings and faults."""
    return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "faults"} for r in read_rows(run_dir)]


def row(name: str, fault: str, survived: str, run_dir: Path | None, *, faults_counted: int | None = None,
        error: str | None = None, before_kill: list[dict] | None = None,
        reference: Path | None = None, **details: Any) -> dict[str, Any]:
    """A table row: what was injected, whether the run survived, and what was lost."""
    summary = json.loads((run_dir / "summary.json").read_text()) if run_dir and (run_dir / "summary.json").is_file() else {}
    rows = comparable_rows(run_dir) if run_dir else []
    checks = {}
    if before_kill is not None:  # what the killed driver wrote is what an uninterrupted run writes
        checks["matches_rows_before_kill"] = rows[: len(before_kill)] == before_kill
    if reference is not None and reference.is_file():
        expected = json.loads(reference.read_text())
        checks["matches_uninterrupted_run"] = rows == expected
        if rows != expected:
            details["first_difference"] = first_difference(expected, rows)
    steps_done = summary.get("steps", 0)
    complete = steps_done == STEPS
    if not complete:
        lost = f"the run: {steps_done} of {STEPS} steps"
    elif checks and not all(checks.values()):
        lost = "metrics differ from an uninterrupted run"
    elif checks:
        lost = "nothing (metrics identical to an uninterrupted run)"
    else:
        lost = "nothing (every step done)"
    return {"scenario": name, "fault": fault, "survived": survived if complete else "no",
            "faults_counted": summary.get("faults", faults_counted), "error": error, "steps": steps_done,
            "lost": lost, **checks, **details}


def first_difference(expected: list[dict[str, Any]], got: list[dict[str, Any]]) -> str:
    """Where two runs' metrics rows first differ, for the record."""
    if len(expected) != len(got):
        return f"{len(got)} rows, expected {len(expected)}"
    for want, have in zip(expected, got, strict=True):
        keys = [k for k in sorted({*want, *have}) if want.get(k) != have.get(k)]
        if keys:
            return f"step {want.get('step')}: " + ", ".join(f"{k} {have.get(k)!r} != {want.get(k)!r}" for k in keys[:3])
    return ""


def first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


# -- process and cluster plumbing ----------------------------------------------------------------
def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal ``pid`` and then end every process below it (a snapshot taken first): only what
    that process started, never other Ray processes on the machine."""
    import psutil

    try:
        parent = psutil.Process(pid)
        tree = parent.children(recursive=True)
    except psutil.Error:
        return
    with contextlib.suppress(psutil.Error):
        parent.send_signal(sig)
    with contextlib.suppress(psutil.Error):
        parent.wait(30)
    for p in tree:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(tree, timeout=10)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()


@contextlib.contextmanager
def private_ray_tmpdir() -> Iterator[Path]:
    """Point Ray's temp dir (sessions, sockets, the address file) at a private folder, so that
    the clusters a scenario starts are never found by a ``ray.init()`` elsewhere."""
    root = Path(tempfile.mkdtemp(prefix="trp-", dir="/tmp"))  # short: Unix socket paths are limited
    old = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = str(root)
    try:
        yield root
    finally:
        if old is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = old
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def multi_node_cluster(gpu_nodes: int) -> Iterator[Any]:
    """A ``ray.cluster_utils.Cluster`` on this machine: a CPU head and ``gpu_nodes`` worker
    nodes that each advertise one (fake) GPU; the rollout engine asks for one."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args=HEAD_NODE)
    try:
        for _ in range(gpu_nodes):
            cluster.add_node(**GPU_NODE)
        yield cluster
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


def node_of_role(run: Any, role: str, cluster: Any) -> Any:
    """The cluster node that holds rank 0 of ``role`` (its placement group's bundle 0)."""
    from ray.util.placement_group import placement_group_table

    pg = run.graph.placement_groups[role]
    node_id = placement_group_table(pg)["bundles_to_node_id"][0]
    for node in cluster.worker_nodes:
        if node.node_id == node_id:
            return node
    raise RuntimeError(f"no worker node holds {role!r} (node {node_id})")


def before_step(run: Any, k: int, inject: Callable[[], None]) -> None:
    """Call ``inject()`` just before the algorithm's step ``k`` (0-based, as in metrics.jsonl)."""
    step = run.algo.step

    def step_with_fault(i: int) -> dict[str, float]:
        if i == k:
            inject()
        return step(i)

    run.algo.step = step_with_fault


class DyingEngine:
    """Mixed into the HF rollout engine: after `die_in_next_generate`, the process exits inside
    its next generate call, with the call in flight as a crash leaves it. A kill sent from the
    driver races the call (32 prompts take about 15 ms) and can land after it returned. A
    restarted engine has its state reset, so it answers."""

    def die_in_next_generate(self) -> None:
        self._die = True

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_die", False):
            os._exit(1)
        return super().generate(*args, **kwargs)


def engine_with(mixin: type) -> type:
    """The HF rollout engine with ``mixin`` in front."""
    from troupe.actors.rollout_hf import HFRolloutEngine

    return type("HFRolloutEngine", (mixin, HFRolloutEngine), {})


def with_engine_mixin(mixin: type) -> None:
    """Build this process's rollout engines as `engine_with(mixin)` (each scenario runs in a
    process of its own)."""
    from troupe.algorithms import policy_graph

    engine_cls = engine_with(mixin)
    policy_graph.rollout_class = lambda backend: engine_cls


def require_engine_method(engines: Any, method: str, mixin: type) -> None:
    """Refuse an injection whose engines were built without its mixin, naming the fix, instead of
    the bare AttributeError Ray raises from inside the step."""
    if not hasattr(engines[0], method):
        raise TypeError(f"the run's rollout engines have no {method!r}: build the run after "
                        f"with_engine_mixin({mixin.__name__}) (or with policy_graph.rollout_class returning "
                        f"engine_with({mixin.__name__}))")


def kill_engine_in_flight(run: Any, k: int) -> None:
    """At step ``k``, rollout engine 0 dies inside that step's generate call (and Ray restarts
    it). The run's engines must have `DyingEngine` mixed in."""
    engines = run.graph["rollout"]
    require_engine_method(engines, "die_in_next_generate", DyingEngine)
    before_step(run, k, lambda: engines.wait([engines[0].die_in_next_generate.remote()], "die_in_next_generate"))


def kill_engine_before_sync(run: Any, k: int) -> None:
    """At step ``k``, kill rollout engine 0 once its batch is in, just before the step's update and
    weight sync (Ray restarts it; the sync must wait for the restart and give it the newest weights)."""
    import ray

    policy, engines = run.algo.policy, run.graph["rollout"]
    update_and_sync = policy.update_and_sync

    def kill_then_update(*a: Any, **kw: Any) -> Any:
        policy.update_and_sync = update_and_sync  # once
        ray.kill(engines[0], no_restart=False)
        return update_and_sync(*a, **kw)

    before_step(run, k, lambda: setattr(policy, "update_and_sync", kill_then_update))


def grpo(out: Path, *extra: str, resume: bool = False) -> Any:
    """A GRPO `Run` at smoke scale writing to ``out`` (or resuming it)."""
    from troupe.platform.driver import Run

    if resume:
        return Run("grpo", resume=out, overrides=list(extra))
    return Run("grpo", preset="smoke", overrides=[*OVERRIDES, *extra], out=out)


# -- scenarios ---------------------------------------------------------------------------------
@scenario("reference")
def reference_run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """An uninterrupted run; its rows are what every other scenario is compared with."""
    with grpo(work / "run", *args.overrides) as run:
        run.run()
    rows = comparable_rows(work / "run")
    if args.save_rows:
        Path(args.save_rows).write_text(json.dumps(rows))
    return row("reference", "none", "continued", work / "run")


@scenario("rollout_killed")
def rollout_killed(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    with_engine_mixin(DyingEngine)
    with grpo(work / "run", *args.overrides) as run:
        kill_engine_in_flight(run, 1)
        run.run()
    return row("rollout_killed", "a rollout engine killed with its generate call in flight (step 1)", "continued",
               work / "run", reference=args.reference)


@scenario("rollout_killed_before_sync")
def rollout_killed_before_sync(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    with grpo(work / "run", *args.overrides) as run:
        kill_engine_before_sync(run, 1)
        run.run()
    return row("rollout_killed_before_sync",
               "a rollout engine killed after its generate returned, before the step's weight sync (step 1)",
               "continued", work / "run", reference=args.reference)


class StragglingEngine:
    """Mixed into the HF rollout engine: `straggle` makes the next call hang, as a stuck engine
    does. A restarted engine has its state reset, so it answers again."""

    def straggle(self, seconds: float) -> None:
        self._straggle_s = seconds

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        seconds = getattr(self, "_straggle_s", 0.0)
        if seconds:
            self._straggle_s = 0.0
            time.sleep(seconds)
        return super().generate(*args, **kwargs)


@scenario("rollout_straggler")
def rollout_straggler(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    with_engine_mixin(StragglingEngine)
    timeout = args.call_timeout_s
    with grpo(work / "run", f"run.call_timeout_s={timeout}", *args.overrides) as run:
        engines = run.graph["rollout"]
        require_engine_method(engines, "straggle", StragglingEngine)
        before_step(run, 1, lambda: engines.wait([engines[0].straggle.remote(3600)], "straggle"))
        run.run()
    step_s = next(r["time/step_s"] for r in read_rows(work / "run") if r["step"] == 1 and "time/step_s" in r)
    return row("rollout_straggler", f"a rollout engine hangs in generate (step 1; call timeout {timeout:.0f} s)",
               "continued", work / "run", reference=args.reference, straggling_step_s=round(step_s, 1))


def straggling_exact(**row_: Any) -> float:
    """The task's exact-match reward, except that it hangs once when the flag file exists."""
    from troupe.platform.registry import REWARDS

    flag = os.environ.get(STRAGGLE_FLAG_ENV)
    if flag and os.path.exists(flag):
        os.remove(flag)
        time.sleep(3600)
    return REWARDS.get("arithmetic_exact")(**row_)


@scenario("reward_straggler")
def reward_straggler(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from troupe.platform.errors import RemoteCallError

    # The reward actor imports this module by name (reward.fn=faults:straggling_exact).
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    flag = work / "straggle.flag"
    os.environ[STRAGGLE_FLAG_ENV] = str(flag)
    timeout = args.call_timeout_s
    extra = [f"run.call_timeout_s={timeout}", "reward.fn=faults:straggling_exact", *args.overrides]
    error, started = None, [0.0]
    with grpo(work / "run", *extra) as run:
        def hang_reward() -> None:
            flag.touch()
            started[0] = time.monotonic()

        before_step(run, 3, hang_reward)
        try:
            run.run()
        except RemoteCallError as e:
            error = first_line(e)
    error_s = time.monotonic() - started[0]
    with grpo(work / "run", "run.call_timeout_s=600", resume=True) as run:
        resumed_from = run.step_index
        run.run()
    return row("reward_straggler", f"the reward actor hangs in step 3 (call timeout {timeout:.0f} s)", "resumed",
               work / "run", error=error, reference=args.reference, error_after_s=round(error_s, 1),
               resumed_from_step=resumed_from)


@scenario("node_lost")
def node_lost(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    with multi_node_cluster(gpu_nodes=2) as cluster:
        with grpo(work / "run", f"run.address={cluster.address}", "rollout.num_gpus=1", *args.overrides) as run:
            before_step(run, 1, lambda: cluster.remove_node(node_of_role(run, "rollout", cluster)))
            run.run()
    return row("node_lost", "the worker node hosting the rollout engine removed before step 1 (a spare node left)",
               "continued", work / "run", reference=args.reference)


@scenario("node_lost_no_spare")
def node_lost_no_spare(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from troupe.platform.errors import RemoteCallError

    timeout = args.call_timeout_s
    # The placement timeout bounds the wait for a lost node too; the cluster is up, so the run's
    # own placement needs only a moment of it.
    placement = args.placement_timeout_s or timeout
    error, started = None, [0.0]
    with multi_node_cluster(gpu_nodes=1) as cluster:
        address = f"run.address={cluster.address}"
        # A restarted engine waits placement + call timeout for its node to come back.
        with grpo(work / "run", address, "rollout.num_gpus=1", f"run.call_timeout_s={timeout}",
                  f"run.placement_timeout_s={placement}", *args.overrides) as run:
            def lose_node() -> None:
                cluster.remove_node(node_of_role(run, "rollout", cluster))
                started[0] = time.monotonic()

            before_step(run, 2, lose_node)  # after the checkpoint of step 2
            try:
                run.run()
            except RemoteCallError as e:
                error = first_line(e)
        error_s = time.monotonic() - started[0]
        cluster.add_node(**GPU_NODE)  # the resources return
        with grpo(work / "run", address, "run.call_timeout_s=600", resume=True) as run:
            resumed_from = run.step_index
            run.run()
    return row("node_lost_no_spare", f"the only GPU node removed before step 2 (call timeout {timeout:.0f} s, "
               f"placement timeout {placement:.0f} s), a node added back after the error", "resumed", work / "run", error=error,
               reference=args.reference,
               error_after_s=round(error_s, 1), resumed_from_step=resumed_from)


def _killed_driver(args: argparse.Namespace, work: Path, pause_at: str) -> dict[str, Any]:
    """``troupe run`` in a subprocess, paused at ``pause_at`` and SIGKILLed there; then
    ``troupe run --resume``."""
    from troupe.platform.checkpoint import CheckpointDir

    run_dir, marker = work / "run", work / "paused"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--paused-troupe-run", pause_at, "--marker", str(marker),
           "--", "run", "grpo", "--preset", "smoke", "--out", str(run_dir), *OVERRIDES, *args.overrides]
    log = open(work / "killed.log", "wb")
    t = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + args.timeout_s
        while not marker.is_file():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the run never reached {pause_at} (exit {proc.poll()}): "
                                   + (work / "killed.log").read_text()[-3000:])
            time.sleep(0.2)
        kill_tree(proc.pid, signal.SIGKILL)
        killed_after_s = time.monotonic() - t
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid, signal.SIGKILL)
        log.close()
    before_kill = comparable_rows(run_dir)
    ckpts = CheckpointDir(run_dir / "checkpoints")
    intact = ckpts.latest()
    partial = sorted(p.name for p in (run_dir / "checkpoints").glob(".step-*.tmp"))
    intact_ok = intact is not None and all((intact / f).is_file() for f in ("learner.safetensors", "driver.json"))
    t = time.monotonic()
    resume = subprocess.run([sys.executable, "-m", "troupe.cli", "run", "grpo", "--resume", str(run_dir)],
                            capture_output=True, text=True, timeout=args.timeout_s)
    resume_s = time.monotonic() - t
    if resume.returncode != 0:
        raise RuntimeError(f"--resume failed ({resume.returncode}): {resume.stderr[-3000:]}")
    kind, _, step = pause_at.partition(":")
    what = ("while writing the checkpoint of step " if kind == "checkpoint" else "inside step ") + step
    return row(f"driver_killed_mid_{kind}", f"`troupe run` SIGKILLed {what}", "resumed", run_dir,
               before_kill=before_kill, reference=args.reference,
               latest_checkpoint_after_kill=intact.name if intact else None, checkpoint_intact=intact_ok,
               partial_checkpoints_after_kill=partial, rows_before_kill=len(before_kill),
               stale_partials_after_resume=sorted(p.name for p in (run_dir / "checkpoints").glob(".step-*.tmp")),
               killed_after_s=round(killed_after_s, 1), resume_s=round(resume_s, 1))


@scenario("driver_killed_mid_checkpoint")
def driver_killed_mid_checkpoint(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    return _killed_driver(args, work, f"checkpoint:{STEPS}")


@scenario("driver_killed_mid_step")
def driver_killed_mid_step(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    return _killed_driver(args, work, "step:3")


def paused_troupe_run(pause_at: str, marker: Path, argv: list[str]) -> int:
    """``troupe <argv>`` that stops dead (writes ``marker`` and sleeps) at ``checkpoint:N``
    (files written, the folder not yet moved into place) or ``step:N`` (after the learner's
    update, before the engines get the weights)."""
    kind, _, n = pause_at.partition(":")
    target = int(n)

    def pause(where: str) -> None:
        marker.write_text(where)
        time.sleep(3600)

    if kind == "checkpoint":
        from troupe.platform.checkpoint import CheckpointDir

        write = CheckpointDir.write

        def paused_write(self: Any, step: int, fill: Callable[[Path], None]) -> Path:
            def fill_then_pause(tmp: Path) -> None:
                fill(tmp)
                if step == target:
                    pause(str(tmp))

            return write(self, step, fill_then_pause)

        CheckpointDir.write = paused_write
    elif kind == "step":
        from troupe.algorithms.grpo.algorithm import GRPO

        grpo_step = GRPO.step

        def paused_step(self: Any, step: int) -> dict[str, float]:
            if step == target:
                update_and_sync = self.policy.update_and_sync

                def update_then_pause(*a: Any, **kw: Any) -> Any:
                    pending = update_and_sync(*a, **kw)
                    pending.result()  # the update and its sync are done: the pause is inside the step
                    pause(f"step {step}")
                    return pending

                self.policy.update_and_sync = update_then_pause
            return grpo_step(self, step)

        GRPO.step = paused_step
    else:
        raise SystemExit(f"--paused-troupe-run: expected checkpoint:N or step:N, got {pause_at!r}")
    from troupe.cli import main

    return main(argv)


# -- running ------------------------------------------------------------------------------------
def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """Run one scenario in this process, in a private Ray temp dir, under a deadline."""
    def on_signal(signum: int, frame: Any) -> None:
        raise TimeoutError(f"scenario {args.scenario} ran past {args.timeout_s:.0f} s" if signum == signal.SIGALRM
                           else f"scenario {args.scenario} was stopped (signal {signum})")

    signal.signal(signal.SIGALRM, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.alarm(int(args.timeout_s))
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix=f"faults-{args.scenario}-"))
    work.mkdir(parents=True, exist_ok=True)
    t = time.monotonic()
    try:
        with private_ray_tmpdir():
            result = SCENARIOS[args.scenario](args, work)
    finally:
        signal.alarm(0)
    result["seconds"] = round(time.monotonic() - t, 1)
    return result


def run_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every scenario (or those of ``--only``, the others' rows kept from the last results),
    each in a process of its own; the reference run first."""
    import common

    rows = []
    only = [n for n in (args.only or "").split(",") if n]
    if unknown := sorted(set(only) - set(SCENARIOS)):
        raise SystemExit(f"--only {unknown}: scenarios are {sorted(SCENARIOS)}")
    kept = {}
    if only:
        previous = common.RESULTS / "faults.json"
        kept = {r["scenario"]: r for r in json.loads(previous.read_text())["rows"]} if previous.is_file() else {}
    with tempfile.TemporaryDirectory(prefix="faults-") as tmp:
        reference = Path(tmp) / "uninterrupted-rows.json"
        names = ["reference", *[n for n in SCENARIOS if n != "reference"]]
        for name in names:
            if only and name != "reference" and name not in only:
                if name in kept:  # measured by an earlier run, under its own overrides
                    rows.append({**kept[name], "kept_from_earlier_results": True})
                continue
            out = Path(tmp) / f"{name}.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--scenario", name, "--json", str(out),
                   "--work", str(Path(tmp) / name), "--call-timeout-s", str(args.call_timeout_s),
                   "--timeout-s", str(args.timeout_s)]
            cmd += ["--save-rows", str(reference)] if name == "reference" else ["--reference", str(reference)]
            print(f"-- {name}", flush=True)
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s + 120)
            if out.is_file():
                rows.append(json.loads(out.read_text()))
            else:
                rows.append({"scenario": name, "survived": "no", "lost": "the scenario failed",
                             "error": (done.stderr or done.stdout)[-1500:]})
            print(json.dumps(rows[-1], indent=1), flush=True)
    table = markdown_table([r for r in rows if r["scenario"] != "reference"])
    print("\n" + table)
    payload = {"steps": STEPS, "checkpoint_every": CHECKPOINT_EVERY, "call_timeout_s": args.call_timeout_s,
               "overrides": OVERRIDES, "rows": rows, "table": table}
    common.write_result("faults", {**payload, "claims": claims(payload)})
    return rows


# A scenario's checks that must all be true where it reports them.
ROW_CHECKS = ("matches_uninterrupted_run", "matches_rows_before_kill", "checkpoint_intact")


def claims(result: dict) -> list[dict]:
    """The top-level claims list: one per injected fault (every row but the reference run),
    holding when the run survived it (continued, or stopped with a named error and
    ``--resume`` finished it) with metrics identical to an uninterrupted run."""
    out = []
    for r in result.get("rows", []):
        if r.get("scenario") == "reference":
            continue
        survived = r.get("survived", "no")
        failed = [k for k in ROW_CHECKS if k in r and r[k] is not True]
        if "matches_uninterrupted_run" not in r:
            failed.append("metrics not compared")
        how = f"{survived} after {r['error'].split(':')[0]}" if r.get("error") else survived
        measured = f"{how}; " + ("metrics identical" if not failed else "failed: " + ", ".join(failed))
        ok = survived in ("continued", "resumed") and not failed
        out.append({"claim": f"{r['scenario']}: {r.get('fault', r['scenario'])} is survived, or stops with a named "
                             "error and --resume finishes, with metrics identical to an uninterrupted run",
                    "measured": measured, "holds": bool(ok)})
    return out


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The README's fault table."""
    lines = ["| fault injected | survived | faults counted | what was lost |", "|---|---|---|---|"]
    for r in rows:
        survived = r.get("survived", "no")
        if r.get("error") and survived == "resumed":
            survived = f"stopped with `{r['error'].split(' (')[0]}`; `--resume` finished it"
        elif survived == "resumed":
            survived = "`--resume` finished it"
        lines.append(f"| {r.get('fault', r['scenario'])} | {survived} | {r.get('faults_counted', '–')} | "
                     f"{r.get('lost', '?')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--paused-troupe-run" in argv:  # the driver that a killed-driver scenario kills
        sep = argv.index("--")
        opts = dict(zip(argv[:sep:2], argv[1:sep:2], strict=True))
        return paused_troupe_run(opts["--paused-troupe-run"], Path(opts["--marker"]), argv[sep + 1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", choices=sorted(SCENARIOS), help="run one scenario in this process")
    p.add_argument("--json", help="write the scenario's row here")
    p.add_argument("--work", help="the scenario's working folder (default: a new temp folder)")
    p.add_argument("--reference", type=Path, help="metrics rows of an uninterrupted run to compare with")
    p.add_argument("--save-rows", help="(reference) write its comparable rows here")
    p.add_argument("--call-timeout-s", type=float, default=60.0, help="run.call_timeout_s where a straggler is cut off")
    p.add_argument("--placement-timeout-s", type=float, default=None,
                   help="run.placement_timeout_s where a lost node is waited for (default: the call timeout)")
    p.add_argument("--timeout-s", type=float, default=600.0, help="a scenario's deadline")
    p.add_argument("--only", help="run these scenarios (comma list) beside the reference; the other rows "
                                  "are kept from the last results")
    p.add_argument("overrides", nargs="*", help="extra config overrides for every run")
    args = p.parse_args(argv)
    if not args.scenario:
        rows = run_all(args)
        return 0 if all(r.get("survived") in ("continued", "resumed") for r in rows) else 1
    result = run_one(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
