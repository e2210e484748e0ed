"""The experimenter loop, the population actor's answers, the config and the summary (no Ray)."""

from __future__ import annotations

import numpy as np
import pytest

from troupe.actors.iv_population_actor import IVPopulationActor
from troupe.algorithms.ivdesign.algorithm import (
    CellsConfig,
    IVDesignConfig,
    PopulationSpec,
    area_under_curve,
    chunk_end,
    report_tables,
    summarise,
)
from troupe.algorithms.ivdesign.experiment import CellSpec, DesignConfig, Experimenter
from troupe.algorithms.ivdesign.model import (
    GPIVPosterior,
    ModelConfig,
    batch_posterior,
    inverse_mills,
    observation_noise,
)
from troupe.envs.iv_population import IV1D
from troupe.platform.config import RunConfig, from_dict
from troupe.platform.errors import ConfigError

DESIGN = DesignConfig(queries=16, initial=3)
MODEL = ModelConfig(restarts=2)


def local_population() -> IVPopulationActor:
    return IVPopulationActor({"p": (IV1D, {})})


def run_cell(actor: IVPopulationActor, method: str, seed: int, design: DesignConfig = DESIGN) -> Experimenter:
    spec = CellSpec("p", method, seed)
    ex = Experimenter(actor.info("p"), method, seed, design, MODEL)

    def ask(u: int, k: int) -> tuple[int, float]:
        return actor.query("p", spec.key, seed, u, k)

    ex.start(ask)
    while len(ex.obs) < design.queries:
        ex.query(ask)
    return ex


def test_the_loop_posterior_equals_the_batch_posterior_of_its_data():
    ex = run_cell(local_population(), "ivig", seed=0, design=DesignConfig(queries=14, initial=3))
    assert len(ex.obs) == 14 and 14 % MODEL.refit_every != 0  # the last four came as rank-1 updates
    X = ex.info.X_pool[np.asarray(ex.units)]
    eta = ex.first_stage.eta(X, ex.obs.z)
    lam = inverse_mills(eta, ex.obs.t)
    prior = GPIVPosterior.prior(ex.grid, ex.hyper, MODEL.tau_mean)
    batch = batch_posterior(prior, ex.obs.g, ex.obs.t, lam, ex.obs.y, observation_noise(ex.hyper, eta, ex.obs.t))
    np.testing.assert_allclose(ex.post.mean, batch.mean, atol=1e-8)
    np.testing.assert_allclose(ex.post.cov, batch.cov, atol=1e-8)


def test_replaying_an_exported_cell_rebuilds_the_same_state():
    actor = local_population()
    ex = run_cell(actor, "ivig", seed=1)
    again = Experimenter(actor.info("p"), "ivig", 1, DESIGN, MODEL)
    again.replay(ex.export())
    np.testing.assert_allclose(again.post.mean, ex.post.mean, atol=1e-10)
    assert again.hyper == ex.hyper
    assert again.next_query() == ex.next_query()  # the method's random state came back too


def test_methods_share_the_initial_design_and_its_answers():
    actor = local_population()
    a, b = run_cell(actor, "ivig", seed=2), run_cell(actor, "random", seed=2)
    n0 = DESIGN.initial
    assert a.units[:n0] == b.units[:n0] and a.z_index[:n0] == b.z_index[:n0]
    np.testing.assert_array_equal(a.obs.y[:n0], b.obs.y[:n0])
    c = run_cell(actor, "ivig", seed=3)
    assert c.units[:n0] != a.units[:n0] or not np.array_equal(c.obs.y[:n0], a.obs.y[:n0])


def test_ivig_queries_where_compliance_informs_the_target():
    # The target is x >= 0.5 and compliance is strong only for x > 0: over 40 queries IVIG asks
    # there mostly (after spending early queries on f0 and rho elsewhere); random asks about half the time.
    actor = local_population()
    x = actor.populations["p"].X_pool[:, 0]
    design = DesignConfig(queries=40, initial=3)
    share = {m: np.mean([np.mean(x[run_cell(actor, m, s, design).units[3:]] > 0) for s in (0, 1)])
             for m in ("ivig", "random")}
    assert share["ivig"] > 0.65 and share["ivig"] > share["random"] + 0.15


def test_population_actor_gives_common_random_numbers_per_visit():
    actor = local_population()
    first = actor.query("p", "cellA", 0, 10, 1)
    second = actor.query("p", "cellA", 0, 10, 1)
    assert actor.query("p", "cellB", 0, 10, 1) == first  # another cell, same seed, first visit
    assert actor.query("p", "cellC", 1, 10, 1) != first  # another seed
    assert second != first
    actor.restore_visits("cellD", [10], [1])
    assert actor.query("p", "cellD", 0, 10, 1) == second
    scores = actor.score("p", [{"mean": np.ones(16), "var": np.ones(16), "p_hat": np.full((41, 2), 0.5)}])
    assert set(scores[0]) == {"rmse", "nlpd", "coverage", "brier", "first_stage_mse"}


def test_steps_cut_the_adaptive_queries_into_chunks():
    d = DesignConfig(queries=40, initial=3)
    ends = [chunk_end(s, 8, d) for s in range(8)]
    assert ends[-1] == 40 and ends == sorted(ends) and ends[0] > 3
    assert [chunk_end(s, 37, d) for s in range(37)] == list(range(4, 41))


def test_config_validation_names_the_key():
    with pytest.raises(ConfigError, match="run.steps"):
        IVDesignConfig(run=RunConfig(steps=100))
    with pytest.raises(ConfigError, match="cells.methods"):
        CellsConfig(methods=["ivig", "thompson"])
    with pytest.raises(ConfigError, match="design.queries"):
        DesignConfig(queries=3, initial=3)
    with pytest.raises(ConfigError, match="distinct labels"):
        CellsConfig(populations=[PopulationSpec("iv_1d"), PopulationSpec("iv_1d")])
    cfg = from_dict(IVDesignConfig, {"cells": {"populations": [{"env": "iv_2d", "params": {"grid_size": 5}}]}})
    assert cfg.cells.populations[0].label == "iv_2d" and cfg.cells.populations[0].params == {"grid_size": 5}


def test_area_under_curve_is_the_mean_of_the_trapezoids():
    assert area_under_curve(np.array([3, 4, 6]), np.array([1.0, 0.5, 0.5])) == pytest.approx((0.75 + 1.0) / 3)


def test_summary_pairs_ivig_with_each_baseline_by_seed():
    cfg = IVDesignConfig(run=RunConfig(steps=1), design=DesignConfig(queries=5, initial=3),
                         cells=CellsConfig(populations=[PopulationSpec("iv_1d", "a")], methods=["ivig", "random"],
                                           seeds=2))
    rows = []
    for seed in (0, 1):
        for method, level in (("ivig", 0.5), ("random", 0.8)):
            for n in (3, 4, 5):
                rows.append({"population": "a", "method": method, "seed": seed, "n": n, "unit": n - 4,
                             "rmse": level + 0.1 * seed + (0.2 if n == 3 else 0.0), "nlpd": 1.0, "coverage": 0.9,
                             "brier": 0.2, "query_s": 0.01})
    s = summarise(rows, cfg, {"a": "x >= 0.5"})
    m = s["populations"]["a"]["methods"]
    assert m["ivig"]["rmse_final"] == pytest.approx(0.55) and m["random"]["rmse_final"] == pytest.approx(0.85)
    assert m["ivig"]["auc"] == pytest.approx(0.55 + 0.05)
    pair = s["populations"]["a"]["ivig_minus_baseline"]["random"]
    assert pair["rmse_final_diff"] == pytest.approx(-0.3) and pair["rmse_final_ivig_wins"] == 1.0
    assert s["claims"]["a"]["ivig_lowest_rmse_final"] and s["claims"]["a"]["ivig_lowest_auc"]
    assert m["ivig"]["to_threshold_median"] == 4.0  # 0.5 at n=4 (seed 0), 0.6 at n=4 (seed 1)
    text = report_tables(s)[0]
    assert "| ivig | 0.550" in text and "Claim check" in text


def test_summary_warns_when_the_fitted_first_stage_ignores_the_instrument():
    cfg = IVDesignConfig(run=RunConfig(steps=1), design=DesignConfig(queries=4, initial=3),
                         cells=CellsConfig(populations=[PopulationSpec("iv_1d", "a")], methods=["ivig"], seeds=1))
    rows = [{"population": "a", "method": "ivig", "seed": 0, "n": n, "unit": n - 4, "rmse": 0.5, "nlpd": 1.0,
             "coverage": 0.9, "brier": 0.2, "query_s": 0.01} for n in (3, 4)]
    rows[-1]["first_stage_effect"] = 0.01
    s = summarise(rows, cfg, {"a": ""})
    assert s["populations"]["a"]["weak_instrument_in_data"]
    assert "instrument looks weak in the data" in report_tables(s)[0]
    rows[-1]["first_stage_effect"] = 0.4
    assert not summarise(rows, cfg, {"a": ""})["populations"]["a"]["weak_instrument_in_data"]
