"""IV populations: the benchmark definitions, the answers they give, and the bad input they refuse."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy.special import expit, ndtr

from troupe.envs.iv_population import (
    IV1D,
    IV2D,
    IVMultiLevel,
    IVTable,
    TargetOutsidePoolWarning,
    WeakInstrumentWarning,
    cate_metrics,
    expected_brier,
    load_covariate_csv,
    make_population,
    synthetic_covariate_table,
)
from troupe.platform.errors import ConfigError, DataError
from troupe.platform.registry import ENVIRONMENTS


def test_iv_1d_is_the_benchmark_population():
    pop = IV1D()
    x = pop.X_pool[:, 0]
    assert len(x) == 41 and x[0] == -2.0 and x[-1] == 2.0
    np.testing.assert_allclose(pop.X_target[:, 0], x[x >= 0.5 - 1e-12])
    assert len(pop.X_target) == 16
    np.testing.assert_allclose(pop.eta(pop.X_pool, 1.0), -1 + 2.5 * expit(3 * x))
    np.testing.assert_allclose(pop.eta(pop.X_pool, 0.0), -1.0)
    np.testing.assert_allclose(pop.tau(pop.X_pool), 1 + 0.5 * x**2)
    np.testing.assert_allclose(pop.f0(pop.X_pool), np.sin(x))
    p = pop.propensity_table()
    assert p.shape == (41, 2)
    # weak compliance for x < 0, strong for x > 0
    assert (p[x < -1, 1] - p[x < -1, 0]).max() < 0.05 and (p[x > 1, 1] - p[x > 1, 0]).min() > 0.6


def test_weak_target_sits_where_compliance_is_weak():
    pop = IV1D(target="weak")
    assert np.all(pop.X_target[:, 0] <= -0.5) and len(pop.X_target) == 16


def test_draw_follows_the_latent_index_model_exactly():
    pop = IV1D()
    unit, k = 30, 1
    t, y = pop.draw(unit, k, np.random.default_rng(5))
    e, eps = np.random.default_rng(5).standard_normal(2)
    x = pop.X_pool[unit, 0]
    eta = -1 + 2.5 * expit(3 * x)
    assert t == int(eta + e > 0)
    assert y == pytest.approx(math.sin(x) + t * (1 + 0.5 * x**2) + e + 0.1 * eps)


def test_draws_reproduce_the_control_function_moment():
    # E[y | t=1, x, z] = f0 + tau + rho * phi(eta)/Phi(eta)
    pop = IV1D()
    unit, rng = 25, np.random.default_rng(0)
    ts, ys = np.array([pop.draw(unit, 1, rng) for _ in range(20000)]).T
    x = pop.X_pool[unit : unit + 1]
    eta = pop.eta(x, 1.0)[0]
    assert ts.mean() == pytest.approx(ndtr(eta), abs=0.01)
    lam1 = math.exp(-0.5 * eta**2) / math.sqrt(2 * math.pi) / ndtr(eta)
    expect = pop.f0(x)[0] + pop.tau(x)[0] + lam1
    assert ys[ts == 1].mean() == pytest.approx(expect, abs=0.03)


def test_multilevel_instrument_has_three_ordered_levels():
    pop = IVMultiLevel()
    assert pop.z_levels == (0.0, 1.0, 2.0)
    p = pop.propensity_table()
    assert np.all(p[:, 0] <= p[:, 1] + 1e-12) and np.all(p[:, 1] <= p[:, 2] + 1e-12)
    np.testing.assert_allclose(p[:, 2], IV1D().propensity_table()[:, 1])


def test_2d_population_grid_and_target():
    pop = IV2D()
    assert pop.X_pool.shape == (81, 2) and pop.covariate_names == ("x1", "x2")
    assert np.all(pop.X_target[:, 0] >= 0.5) and len(pop.X_target) == 36
    x = pop.X_pool
    np.testing.assert_allclose(pop.tau(x), 1 + 0.5 * x[:, 0] ** 2 + 0.25 * x[:, 1])


def test_no_compliance_anywhere_is_refused():
    with pytest.raises(ConfigError, match="no effect on treatment"):
        IV1D(compliance=0.0)


def test_weak_instrument_warns():
    with pytest.warns(WeakInstrumentWarning, match="weak instrument"):
        IV1D(compliance=0.05)


def test_target_outside_the_pool_is_refused_or_warned():
    with pytest.raises(DataError, match="outside the candidate pool"):
        IV1D(target_points=[1.0, 3.0])
    with pytest.warns(TargetOutsidePoolWarning):
        pop = IV1D(target_points=[1.0, 3.0], allow_target_outside_pool=True)
    assert len(pop.X_target) == 2


def test_bad_population_parameters_name_the_key():
    with pytest.raises(ConfigError, match="target"):
        IV1D(target="middle")
    with pytest.raises(ConfigError, match="grid_size"):
        IV1D(grid_size=2)
    with pytest.raises(ConfigError, match="bad parameters"):
        make_population("iv_1d", {"no_such_key": 1})
    with pytest.raises(ConfigError, match="not an IV population"):
        make_population("video_qa", {})


def test_populations_are_registered():
    for name in ("iv_1d", "iv_multilevel", "iv_2d", "iv_table"):
        assert name in ENVIRONMENTS


def test_generated_tables_have_the_shape_of_ihdp_and_401k():
    X, names = synthetic_covariate_table("ihdp", np.random.default_rng(0))
    assert X.shape == (747, 25) and names[0] == "bw" and "mom.hs" in names
    assert set(np.unique(X[:, 6:])) <= {0.0, 1.0}
    X, names = synthetic_covariate_table("401k", np.random.default_rng(0))
    assert X.shape == (9915, 9) and names == ["age", "inc", "educ", "fsize", "marr", "twoearn", "db", "pira", "hown"]
    assert X[:, 0].min() >= 25 and X[:, 0].max() <= 64


def test_table_population_target_is_the_strong_compliance_quartile():
    pop = IVTable(table="ihdp", pool=200)
    assert pop.X_pool.shape == (200, 25)
    np.testing.assert_allclose(pop.X_pool.mean(0), 0, atol=1e-9)
    c = pop.X_pool[:, pop.c_index]
    assert len(pop.X_target) == int(np.sum(c >= np.quantile(c, 0.75)))
    p = pop.propensity_table()
    strong = np.isin(np.arange(200), np.flatnonzero(c >= np.quantile(c, 0.75)))
    assert (p[strong, 1] - p[strong, 0]).mean() > (p[~strong, 1] - p[~strong, 0]).mean()


def _write(path, text):
    path.write_text(text)
    return path


def test_csv_loader_reads_a_numeric_table(tmp_path):
    X, names = synthetic_covariate_table("401k", np.random.default_rng(1))
    path = tmp_path / "k401.csv"
    np.savetxt(path, X[:300], delimiter=",", header=",".join(names), comments="")
    X2, names2 = load_covariate_csv(path)
    assert names2 == names
    np.testing.assert_allclose(X2, X[:300])
    X3, names3 = load_covariate_csv(path, columns=["inc", "age"])
    np.testing.assert_allclose(X3, X[:300][:, [1, 0]])
    pop = IVTable(csv=str(path), pool=100, compliance_column="inc")
    assert pop.X_pool.shape == (100, 9) and pop.covariate_names[1] == "inc"


def test_csv_with_missing_values_names_the_column_and_line(tmp_path):
    path = _write(tmp_path / "m.csv", "a,b\n1,2\n3,\n5,NA\n")
    with pytest.raises(DataError, match=r"column 'b' has 2 missing value\(s\) \(lines 3, 4\)"):
        load_covariate_csv(path)


def test_csv_with_a_non_numeric_column_names_it(tmp_path):
    path = _write(tmp_path / "s.csv", "age,site\n30,ark\n40,tex\n")
    with pytest.raises(DataError, match="column 'site' is not numeric .*'ark'"):
        load_covariate_csv(path)
    X, names = load_covariate_csv(path, columns=["age"])
    assert names == ["age"] and X[:, 0].tolist() == [30.0, 40.0]


def test_csv_structure_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_covariate_csv(tmp_path / "none.csv")
    with pytest.raises(DataError, match="row 3 has 1 cells"):
        load_covariate_csv(_write(tmp_path / "r.csv", "a,b\n1,2\n3\n"))
    with pytest.raises(DataError, match="no column 'c'"):
        load_covariate_csv(_write(tmp_path / "c.csv", "a,b\n1,2\n"), columns=["c"])


def test_constant_columns_are_dropped_with_a_warning(tmp_path):
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.normal(size=50), np.ones(50), rng.normal(size=50)])
    path = tmp_path / "k.csv"
    np.savetxt(path, X, delimiter=",", header="u,const,v", comments="")
    with pytest.warns(UserWarning, match="constant column"):
        pop = IVTable(csv=str(path), pool=50)
    assert pop.covariate_names == ("u", "v")


def test_cate_metrics_exact_values():
    m = cate_metrics(np.array([1.0, 2.0]), np.array([1.0, 4.0]), np.array([1.0, 0.0]))
    assert m["rmse"] == pytest.approx(math.sqrt(2.0))
    nlpd = 0.5 * (0.5 * math.log(2 * math.pi) + 0.5 * math.log(2 * math.pi * 4) + 4 / 8)
    assert m["nlpd"] == pytest.approx(nlpd)
    assert m["coverage"] == 1.0  # |errors| 0 and 2 lie within 1.645 sd = 1.645 and 3.29
    m2 = cate_metrics(np.array([0.0, 0.0]), np.array([1.0, 1.0]), np.array([1.0, 2.0]))
    assert m2["coverage"] == 0.5


def test_expected_brier_is_the_bernoulli_expectation():
    assert expected_brier(np.array([0.5]), np.array([0.5])) == pytest.approx(0.25)
    assert expected_brier(np.array([1.0]), np.array([0.0])) == pytest.approx(1.0)
    p_hat, p = 0.3, 0.6
    assert expected_brier(np.array([p_hat]), np.array([p])) == pytest.approx(p * (1 - p_hat) ** 2 + (1 - p) * p_hat**2)


def test_no_warning_for_a_sound_population():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        IV1D()
        IV2D()
