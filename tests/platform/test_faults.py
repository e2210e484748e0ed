"""Fault tolerance of the runtime: a straggling call is cut off by its timeout, and a driver
killed while writing a checkpoint leaves the previous one intact and resumes exactly."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from troupe.platform.errors import RemoteCallError
from troupe.platform.placement import ActorGraph, Role

FAULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "faults.py"


class Sleeper:
    def nap(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


@pytest.mark.timeout(120)
def test_straggling_call_is_cut_off_by_the_call_timeout_naming_role_and_method(ray_local):
    graph = ActorGraph([Role("judge", Sleeper, num_cpus=0.1)], timeout_s=60, call_timeout_s=60).start()
    try:
        graph["judge"].timeout_s = 1  # as if run.call_timeout_s=1 (the actor has started by now)
        t = time.monotonic()
        with pytest.raises(RemoteCallError, match=r"judge\.nap did not answer within 1s.*run\.call_timeout_s"):
            graph["judge"].call("nap", 600)
        assert time.monotonic() - t < 15
    finally:
        graph.shutdown()  # ends the straggler too


def run_scenario(name: str, work: Path, timeout_s: int) -> dict:
    """One scenario of benchmarks/faults.py in a process of its own (it starts its own Ray
    clusters and stops only what it started); returns its row."""
    out = work / f"{name}.json"
    done = subprocess.run([sys.executable, str(FAULTS), "--scenario", name, "--json", str(out), "--work", str(work),
                           "--timeout-s", str(timeout_s)], capture_output=True, text=True, timeout=timeout_s + 60)
    assert done.returncode == 0 and out.is_file(), done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(out.read_text())


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_driver_killed_while_writing_a_checkpoint_keeps_the_previous_one_and_resumes_with_identical_metrics(
    tmp_path: Path, troupe_cache: Path
):
    # `troupe run` (4 steps, a checkpoint every 2) is SIGKILLed with the files of checkpoint 4
    # written but not yet moved into place; `troupe run --resume` then recomputes steps 2-3.
    row = run_scenario("driver_killed_mid_checkpoint", tmp_path, timeout_s=500)
    assert row["partial_checkpoints_after_kill"] and row["partial_checkpoints_after_kill"][0].startswith(".step-00000004.")
    assert row["latest_checkpoint_after_kill"] == "step-00000002" and row["checkpoint_intact"]
    assert row["survived"] == "resumed" and row["steps"] == 4
    # Every row the killed driver wrote (through step 3 and the evaluation at 4) comes out
    # the same from the resumed run: the kill lost nothing.
    assert row["rows_before_kill"] == 7 and row["matches_rows_before_kill"]
    assert row["stale_partials_after_resume"] == []
