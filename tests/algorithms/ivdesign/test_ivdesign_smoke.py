"""`ivdesign` end to end on Ray: the smoke preset, its run directory, and a resume that changes nothing."""

from __future__ import annotations

import json

import pytest

from troupe.cli import main
from troupe.platform.driver import Run


@pytest.fixture(scope="module")
def smoke_run(ray_local, tmp_path_factory):
    out = tmp_path_factory.mktemp("ivdesign") / "smoke"
    with Run("ivdesign", preset="smoke", out=out) as run:
        summary = run.run()
    return out, summary


@pytest.mark.timeout(180)
def test_smoke_run_writes_report_summary_and_plots(smoke_run):
    out, summary = smoke_run
    pop = summary["populations"]["1d_strong"]
    assert set(pop["methods"]) == {"ivig", "random"}
    for agg in pop["methods"].values():
        assert agg["cells"] == 2 and agg["complete"] == 2
        assert 0 < agg["rmse_final"] < 5 and 0 <= agg["coverage_final"] <= 1 and 0 < agg["brier_final"] < 1
    assert summary["faults"] == 0 and not summary["faults_detail"]
    report = (out / "report.md").read_text()
    assert "## Target-CATE accuracy" in report and "IVIG minus baseline" in report
    assert (out / "plots" / "rmse_curves.png").stat().st_size > 0
    assert (out / "plots" / "query_locations.png").stat().st_size > 0
    assert json.loads((out / "summary.json").read_text())["populations"]["1d_strong"]["env"] == "iv_1d"
    rows = json.loads((out / "cells.json").read_text())
    assert {r["n"] for r in rows} == set(range(3, 13))  # every query of every cell is scored
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["queries"] for m in metrics if "queries" in m] == [6.0, 9.0, 12.0]


@pytest.mark.timeout(180)
def test_troupe_report_rebuilds_the_result_from_the_run_directory_alone(smoke_run):
    out, summary = smoke_run
    (out / "report.md").unlink()
    assert main(["report", str(out)]) == 0
    rebuilt = json.loads((out / "summary.json").read_text())
    assert rebuilt["populations"] == json.loads(json.dumps(summary["populations"]))
    assert "## Target-CATE accuracy" in (out / "report.md").read_text()


@pytest.mark.timeout(180)
def test_resume_from_a_checkpoint_reproduces_the_uninterrupted_run(smoke_run, tmp_path):
    out, _ = smoke_run
    part = tmp_path / "part"
    # One worker instead of the smoke preset's two: a cell's answers must not depend on where it runs.
    with Run("ivdesign", preset="smoke", out=part, overrides=["run.checkpoint_every=1", "workers.count=1"]) as run:
        run.step()  # one chunk, checkpointed, then the run stops
    with Run("ivdesign", resume=part) as run:
        run.run()
    key = ("population", "method", "seed", "n")

    def table(path):
        return {tuple(r[k] for k in key): (r["rmse"], r["unit"], r["t"]) for r in json.loads(path.read_text())}

    resumed, full = table(part / "cells.json"), table(out / "cells.json")
    assert resumed.keys() == full.keys()
    for k in full:
        assert resumed[k][1:] == full[k][1:], k
        assert resumed[k][0] == pytest.approx(full[k][0], abs=1e-9), k
