"""Sweeps: the grid and its checks, closed form against exact pulls, aggregation, Ray pairs, smoke."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from troupe.algorithms.bandit.algorithm import BanditConfig, build_cells
from troupe.algorithms.bandit.policies import PolicyParams
from troupe.algorithms.bandit.sweep import (
    Cell,
    check_grid,
    curve_slope,
    loglog_slope,
    run_cell,
    run_local,
    summarize_sweep,
)
from troupe.platform.config import from_dict
from troupe.platform.errors import ConfigError


def test_a_batch_size_that_does_not_divide_the_horizon_is_refused():
    check_grid([16, 64], [2**10, 2**12])
    with pytest.raises(ConfigError, match="B=48 does not divide the horizon T=1024"):
        check_grid([16, 48], [1024])
    with pytest.raises(ConfigError, match="B=48"):
        from_dict(BanditConfig, {"sweep": {"batch_sizes": [48], "horizons": [1024]}})


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="sweep.policies.*nope"):
        from_dict(BanditConfig, {"sweep": {"policies": ["bitpe", "nope"]}})
    with pytest.raises(ConfigError, match="sweep.mode=exact"):
        from_dict(BanditConfig, {"env": {"noise": "rademacher"}})
    with pytest.raises(ConfigError, match="env.theta_norm"):
        from_dict(BanditConfig, {"env": {"theta_norm": 0.0}})
    with pytest.raises(ConfigError, match="sweep.arm_counts"):
        from_dict(BanditConfig, {"env": {"arms": "hypercube"}, "sweep": {"arm_counts": [50]}})
    with pytest.raises(ConfigError, match="hypercube.log2_k"):
        from_dict(BanditConfig, {"hypercube": {"d": 3, "log2_k": [4]}})


def test_cells_put_seeds_outermost_and_run_unbatched_policies_once():
    cfg = from_dict(BanditConfig, {"sweep": {"seeds": 2, "batch_sizes": [16, 64], "horizons": [1024],
                                             "policies": ["bitpe", "linucb"]},
                                   "hypercube": {"enabled": False}})
    cells = build_cells(cfg)
    assert [c.seed for c in cells] == [0, 0, 0, 1, 1, 1]
    assert sorted((c.policy, c.batch) for c in cells if c.seed == 0) == [("bitpe", 16), ("bitpe", 64), ("linucb", 1)]


def test_loglog_slope_is_exact_on_a_power_law():
    x = np.array([16, 64, 256, 1024.0])
    slope, c = loglog_slope(x, 3 * x**0.5)
    assert math.isclose(slope, 0.5) and math.isclose(c, math.log(3))
    t = np.geomspace(1, 1e6, 30)
    assert math.isclose(curve_slope(t, t**0.7 + (t < 10) * 5.0, burn_in=1e-3), 0.7, rel_tol=1e-9)
    assert math.isnan(loglog_slope([1.0], [2.0])[0])


def test_closed_form_batch_means_and_exact_pulls_give_the_same_regret():
    p = PolicyParams()
    for policy in ("bitpe", "bitpe_safe"):
        r = {mode: [run_cell(Cell(policy, s, 16, 2**12, 4, 20, mode=mode), p)["regret"] for s in range(12)]
             for mode in ("closed_form", "exact")}
        diff = np.mean(r["closed_form"]) - np.mean(r["exact"])
        se = math.sqrt(np.var(r["closed_form"], ddof=1) / 12 + np.var(r["exact"], ddof=1) / 12)
        assert abs(diff) < 4 * se + 1e-9


def test_summary_of_a_small_sweep_has_tables_slopes_and_claims():
    cells = [Cell(p, s, b, t, 4, 20) for s in range(2) for t in (2**12, 2**14) for b in (16, 64)
             for p in ("unquantised", "bitpe", "bitpe_safe", "sign_bit")]
    cells += [Cell("bitpe", s, 16, 2**14, d, k) for s in range(2) for d, k in ((2, 20), (4, 40))]
    cells += [Cell("bitpe", s, 16, 2**12, 4, 2**m, group="hypercube", arms="hypercube", sigma=0.0, gap=0.5)
              for s in range(2) for m in (1, 2, 3)]
    results = run_local(cells, PolicyParams(), points=16)
    summary = summarize_sweep(results, burn_in=1 / 16, shape=(4, 20))
    json.dumps(summary)  # summary.json must be able to hold it
    main = summary["main"]
    assert main["T"] == 2**14 and {(r["policy"], r["B"]) for r in main["table"]} == {
        (p, b) for p in ("unquantised", "bitpe", "bitpe_safe", "sign_bit") for b in (16, 64)}
    assert set(main["slope_vs_B"]) == {"unquantised", "bitpe", "bitpe_safe", "sign_bit"}
    assert set(main["slope_vs_T"]["bitpe"]) == {"16", "64"}
    assert [seg[:2] for seg in main["local_slopes_vs_T"]["bitpe"]["16"]] == [[2**12, 2**14]]
    assert set(main["slope_vs_d"]) == {"bitpe@B16"} and set(main["slope_vs_log_k"]) == {"bitpe@B16"}
    names = [c["claim"] for c in summary["claims"]]
    assert any("small factor" in n for n in names) and any("hypercube" in n for n in names)
    assert [r["log2_k"] for r in summary["hypercube"]["table"]] == [1, 2, 3]
    assert summary["hypercube"]["table"][0]["lower_bound_per_B"] == pytest.approx(0.25)


@pytest.mark.timeout(120)
def test_learner_agent_pairs_on_ray_match_the_in_process_run(ray_local):
    from troupe.actors.bandit_agent import BanditAgent, RewardAccessError
    from troupe.algorithms.bandit.sweep import CellLearner, run_pairs

    ray = ray_local
    learners = [ray.remote(CellLearner).options(num_cpus=0.25).remote({}, 60.0)]
    agents = [ray.remote(BanditAgent).options(num_cpus=0.25).remote()]
    cells = [Cell(p, 0, 16, 2**12, 4, 20) for p in ("bitpe_safe", "unquantised")]
    try:
        remote = run_pairs(cells, learners, agents, points=16, timeout_s=60)
        local = run_local(cells, PolicyParams(), points=16)
        for a, b in zip(remote, local, strict=True):
            assert a["policy"] == b["policy"] and a["regret"] == pytest.approx(b["regret"])
            assert a["bits"] == b["bits"] and a["pulls"] == 2**12
        # a learner holding only the agent's handle cannot read the report
        with pytest.raises(RewardAccessError):
            try:
                ray.get(agents[0].report.remote("not the key"), timeout=30)
            except ray.exceptions.RayTaskError as e:
                raise e.cause from None
    finally:
        for h in learners + agents:
            ray.kill(h)


@pytest.mark.timeout(180)
def test_smoke_run_end_to_end(ray_local, tmp_path):
    from troupe.cli import main
    from troupe.platform.driver import Run

    with Run("bandit", preset="smoke", out=tmp_path / "run", overrides=["run.progress=false"]) as run:
        summary = run.run()
    run_dir = tmp_path / "run"
    assert summary["cells_missing"] == 0 and summary["cells"] > 0
    assert json.loads((run_dir / "summary.json").read_text())["main"]["table"]
    report = (run_dir / "report.md").read_text()
    assert "What the sweep shows" in report and "bandit_regret_vs_B.png" in report
    for name in ("bandit_regret_curves", "bandit_regret_vs_B", "bandit_regret_vs_T", "bandit_hypercube"):
        assert (run_dir / "plots" / f"{name}.png").stat().st_size > 1000
    rows = [json.loads(x) for x in (run_dir / "cells.jsonl").read_text().splitlines()]
    assert all(r["pulls"] == r["horizon"] for r in rows)
    # `troupe report` rebuilds the same result from the run directory alone.
    (run_dir / "report.md").unlink()
    assert main(["report", str(run_dir)]) == 0
    rebuilt = json.loads((run_dir / "summary.json").read_text())["main"]
    assert json.dumps(rebuilt, sort_keys=True) == json.dumps(summary["main"], sort_keys=True)  # NaN slopes too
    assert "What the sweep shows" in (run_dir / "report.md").read_text()
