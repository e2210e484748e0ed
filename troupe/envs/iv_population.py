"""Populations for adaptive instrumental-variable experiments under noncompliance.

A population is a pool of units (covariate rows) that an experimenter may query with an
instrument level ``z``; each answer is a realised treatment ``t`` (the unit may not comply)
and an outcome ``y``. The population alone knows the truth::

    e ~ N(0, 1)                         first-stage error, also the unobserved confounder
    t = 1[eta(x, z) + e > 0]            latent-index probit first stage
    y = f0(x) + t * tau(x) + rho * e + sigma * eps,   eps ~ N(0, 1)

so ``tau(x)`` is the conditional average treatment effect, and ``rho != 0`` confounds a
naive regression of ``y`` on ``t``. What an experimenter may see is `PopulationInfo`: the
covariates of the pool and of the target population, the instrument levels, never the truth.

Registered environments: ``iv_1d`` (the 41-point benchmark: weak compliance for x<0, strong
for x>0), ``iv_multilevel`` (the same with z in {0, 1, 2}), ``iv_2d`` (a 9x9 covariate grid),
``iv_table`` (semi-synthetic: a covariate table, either a user's CSV file or a generated
table shaped like IHDP's or 401(k)'s, with simulated instrument, compliance and outcomes).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import expit, ndtr, ndtri

from troupe.platform.errors import ConfigError, DataError
from troupe.platform.registry import ENVIRONMENTS

#: Cell texts read as missing values in a covariate file.
MISSING_TOKENS = frozenset({"", "na", "n/a", "nan", "null", "none", "?", "."})


class WeakInstrumentWarning(UserWarning):
    """The instrument moves treatment uptake very little anywhere in the pool."""


class TargetOutsidePoolWarning(UserWarning):
    """Some target units lie outside the candidate pool: their CATE can only be extrapolated."""


@dataclasses.dataclass(frozen=True)
class PopulationInfo:
    """What an experimenter may know of a population: covariates and levels, never the truth."""

    name: str
    X_pool: np.ndarray  # (n, d) candidate units
    X_target: np.ndarray  # (M, d) target population
    z_levels: tuple[float, ...]
    covariate_names: tuple[str, ...]
    target_description: str


# -- metrics that need the truth (computed where the truth lives) ---------------------------
def cate_metrics(mean: np.ndarray, var: np.ndarray, truth: np.ndarray, level: float = 0.9) -> dict[str, float]:
    """RMSE, mean marginal NLPD and central-interval coverage of ``truth`` under N(mean, var)."""
    mean, var, truth = (np.asarray(a, dtype=float) for a in (mean, var, truth))
    var = np.maximum(var, 1e-12)
    err = mean - truth
    # NLPD_j = 0.5 log(2 pi v_j) + (tau_j - m_j)^2 / (2 v_j), averaged over target units
    nlpd = 0.5 * np.log(2 * np.pi * var) + 0.5 * err**2 / var
    half = ndtri(0.5 + level / 2) * np.sqrt(var)
    return {
        "rmse": float(np.sqrt(np.mean(err**2))),
        "nlpd": float(np.mean(nlpd)),
        "coverage": float(np.mean(np.abs(err) <= half)),
    }


def expected_brier(p_hat: np.ndarray, p_true: np.ndarray) -> float:
    """Expected Brier score of predictions ``p_hat`` for t ~ Bernoulli(p_true): E(p_hat - t)^2."""
    p_hat, p_true = np.asarray(p_hat, dtype=float), np.asarray(p_true, dtype=float)
    # E(p_hat - t)^2 = (p_hat - p)^2 + p (1 - p)
    return float(np.mean((p_hat - p_true) ** 2 + p_true * (1 - p_true)))


# -- the base class -------------------------------------------------------------------------
class IVPopulation:
    """A pool of units with a probit first stage and a confounded outcome; subclasses give the truth."""

    name = "iv_population"

    def __init__(
        self,
        X_pool: np.ndarray,
        X_target: np.ndarray,
        z_levels: tuple[float, ...],
        covariate_names: tuple[str, ...],
        target_description: str,
        confounding: float = 1.0,
        noise: float = 0.1,
        allow_target_outside_pool: bool = False,
    ) -> None:
        self.X_pool = np.atleast_2d(np.asarray(X_pool, dtype=float))
        self.X_target = np.atleast_2d(np.asarray(X_target, dtype=float))
        self.z_levels = tuple(float(z) for z in z_levels)
        self.covariate_names = tuple(covariate_names)
        self.target_description = target_description
        self.confounding = float(confounding)
        self.noise = float(noise)
        if noise < 0:
            raise ConfigError(f"env noise={noise}: expected a standard deviation >= 0")
        if len(self.z_levels) < 2:
            raise ConfigError(f"env z_levels={list(self.z_levels)}: an instrument needs at least two levels")
        if len(self.X_target) == 0:
            raise ConfigError(f"{self.name}: the target population ({target_description}) holds no units")
        check_target_in_pool(self.X_pool, self.X_target, allow_target_outside_pool, self.name)
        check_relevance(self.propensity_table(), self.z_levels, self.name)

    # -- the truth (subclasses) ----------------------------------------------------------------
    def eta(self, X: np.ndarray, z: np.ndarray | float) -> np.ndarray:
        """First-stage index: P(t=1 | x, z) = Phi(eta(x, z))."""
        raise NotImplementedError

    def tau(self, X: np.ndarray) -> np.ndarray:
        """Conditional average treatment effect tau(x) = f(1, x) - f(0, x)."""
        raise NotImplementedError

    def f0(self, X: np.ndarray) -> np.ndarray:
        """Untreated outcome surface."""
        raise NotImplementedError

    # -- derived -------------------------------------------------------------------------------
    def propensity(self, X: np.ndarray, z: np.ndarray | float) -> np.ndarray:
        return ndtr(self.eta(X, z))

    def truth(self) -> dict[str, Any]:
        """The truth on pool and target, for a report's plots (never for an experimenter)."""
        return {"X_pool": self.X_pool, "X_target": self.X_target, "tau_pool": self.tau(self.X_pool),
                "tau_target": self.target_cate(), "propensity": self.propensity_table()}

    def propensity_table(self) -> np.ndarray:
        """P(t=1 | x_u, z_k) for every pool unit u and instrument level k: shape (n, K)."""
        return np.stack([self.propensity(self.X_pool, z) for z in self.z_levels], axis=1)

    def info(self) -> PopulationInfo:
        return PopulationInfo(self.name, self.X_pool.copy(), self.X_target.copy(), self.z_levels,
                              self.covariate_names, self.target_description)

    def target_cate(self) -> np.ndarray:
        return self.tau(self.X_target)

    def draw(self, unit: int, z_index: int, rng: np.random.Generator) -> tuple[int, float]:
        """Query pool unit ``unit`` at instrument level ``z_levels[z_index]``: one (t, y)."""
        if not 0 <= unit < len(self.X_pool):
            raise DataError(f"{self.name}: unit {unit} is not in the pool (0..{len(self.X_pool) - 1})")
        if not 0 <= z_index < len(self.z_levels):
            raise DataError(f"{self.name}: instrument index {z_index} is not one of 0..{len(self.z_levels) - 1}")
        x = self.X_pool[unit : unit + 1]
        e, eps = rng.standard_normal(2)
        t = int(self.eta(x, self.z_levels[z_index])[0] + e > 0)
        y = self.f0(x)[0] + t * self.tau(x)[0] + self.confounding * e + self.noise * eps
        return t, float(y)

    def score(self, mean: np.ndarray, var: np.ndarray, p_hat: np.ndarray | None = None) -> dict[str, float]:
        """Target-CATE metrics of a posterior (and the first stage's Brier score, if given)."""
        out = cate_metrics(mean, var, self.target_cate())
        if p_hat is not None:
            p_true = self.propensity_table()
            out["brier"] = expected_brier(p_hat, p_true)
            out["first_stage_mse"] = float(np.mean((np.asarray(p_hat) - p_true) ** 2))
        return out


def check_target_in_pool(X_pool: np.ndarray, X_target: np.ndarray, allow_outside: bool, name: str) -> None:
    """Refuse (or, when allowed, warn about) target units outside the pool's covariate range."""
    lo, hi = X_pool.min(axis=0), X_pool.max(axis=0)
    tol = 1e-9 * (1 + np.abs(hi - lo))
    outside = np.any((X_target < lo - tol) | (X_target > hi + tol), axis=1)
    if outside.any():
        worst = X_target[np.argmax(np.max(np.maximum(lo - X_target, X_target - hi), axis=1))]
        msg = (f"{name}: {int(outside.sum())} of {len(X_target)} target units lie outside the candidate "
               f"pool's covariate range [{_fmt_vec(lo)}, {_fmt_vec(hi)}] (e.g. {_fmt_vec(worst)}); no query can "
               "reach them, so their CATE is extrapolated from the prior. Choose a target inside the pool, widen "
               "the pool, or set allow_target_outside_pool=true to accept extrapolation.")
        if not allow_outside:
            raise DataError(msg)
        warnings.warn(msg, TargetOutsidePoolWarning, stacklevel=3)


def check_relevance(p_table: np.ndarray, z_levels: tuple[float, ...], name: str,
                    min_effect: float = 1e-3, weak_effect: float = 0.05) -> None:
    """Refuse an instrument that moves no unit's treatment probability; warn when it barely does."""
    effect = float(np.max(p_table.max(axis=1) - p_table.min(axis=1)))
    if effect < min_effect:
        raise ConfigError(
            f"{name}: the instrument has no effect on treatment: P(t=1 | x, z) is the same for every level "
            f"z in {list(z_levels)} at every pool unit (largest change {effect:.2g}). Instrumental-variable "
            "design needs relevance (compliance somewhere): raise the compliance strength."
        )
    if effect < weak_effect:
        warnings.warn(f"{name}: weak instrument: z changes P(t=1) by at most {effect:.3f} anywhere in the "
                      "pool; the CATE is barely identified.", WeakInstrumentWarning, stacklevel=3)


def _fmt_vec(v: np.ndarray) -> str:
    v = np.atleast_1d(v)
    if len(v) > 4:
        return "(" + ", ".join(f"{a:.3g}" for a in v[:4]) + ", ...)"
    return "(" + ", ".join(f"{a:.3g}" for a in v) + ")"


# -- the 1-D benchmark population ---------------------------------------------------------
class IV1D(IVPopulation):
    """The 1-D benchmark: eta = base + compliance * z * sigmoid(slope * x), tau = 1 + x^2/2, f0 = sin x.

    Compliance is weak for x < 0 and strong for x > 0. ``target`` is ``strong`` (x >= 0.5),
    ``weak`` (x <= -0.5) or ``all``; ``target_points`` lists target covariates explicitly.
    """

    name = "iv_1d"

    def __init__(
        self,
        grid_size: int = 41,
        low: float = -2.0,
        high: float = 2.0,
        target: str = "strong",
        target_points: list[float] | None = None,
        levels: int = 2,
        base: float = -1.0,
        compliance: float = 2.5,
        slope: float = 3.0,
        confounding: float = 1.0,
        noise: float = 0.1,
        allow_target_outside_pool: bool = False,
    ) -> None:
        if grid_size < 3:
            raise ConfigError(f"env grid_size={grid_size}: expected at least 3 units")
        if not high > low:
            raise ConfigError(f"env low={low}, high={high}: expected low < high")
        if levels < 2:
            raise ConfigError(f"env levels={levels}: an instrument needs at least 2 levels")
        self.base, self.compliance, self.slope = float(base), float(compliance), float(slope)
        self.z_max = float(levels - 1)
        x = np.linspace(low, high, grid_size)[:, None]
        if target_points is not None:
            xt = np.asarray(target_points, dtype=float).reshape(-1, 1)
            desc = f"{len(xt)} given points"
        else:
            xt, desc = _threshold_target(x, target)
        super().__init__(x, xt, tuple(float(k) for k in range(levels)), ("x",), desc, confounding, noise,
                         allow_target_outside_pool)

    def eta(self, X: np.ndarray, z: np.ndarray | float) -> np.ndarray:
        # Multi-level instruments scale to the same top level as the binary one.
        return self.base + self.compliance * (np.asarray(z) / self.z_max) * expit(self.slope * X[:, 0])

    def tau(self, X: np.ndarray) -> np.ndarray:
        return 1.0 + 0.5 * X[:, 0] ** 2

    def f0(self, X: np.ndarray) -> np.ndarray:
        return np.sin(X[:, 0])


def _threshold_target(x: np.ndarray, target: str, column: int = 0) -> tuple[np.ndarray, str]:
    if target == "strong":
        return x[x[:, column] >= 0.5 - 1e-12], "x >= 0.5 (strong compliance)"
    if target == "weak":
        return x[x[:, column] <= -0.5 + 1e-12], "x <= -0.5 (weak compliance)"
    if target == "all":
        return x, "the whole pool"
    raise ConfigError(f"env target={target!r}: expected 'strong', 'weak' or 'all'")


class IVMultiLevel(IV1D):
    """`IV1D` with a multi-level instrument z in {0, .., levels-1} (default 3 levels)."""

    name = "iv_multilevel"

    def __init__(self, levels: int = 3, **kwargs: Any) -> None:
        super().__init__(levels=levels, **kwargs)


class IV2D(IVPopulation):
    """Two covariates on a ``grid_size`` x ``grid_size`` grid; compliance strong for x1 > 0.

    eta = base + compliance * z * sigmoid(slope * x1), tau = 1 + x1^2/2 + x2/4,
    f0 = sin x1 + cos(x2)/2; ``target`` thresholds x1 as in `IV1D`.
    """

    name = "iv_2d"

    def __init__(
        self,
        grid_size: int = 9,
        low: float = -2.0,
        high: float = 2.0,
        target: str = "strong",
        base: float = -1.0,
        compliance: float = 2.5,
        slope: float = 3.0,
        confounding: float = 1.0,
        noise: float = 0.1,
        allow_target_outside_pool: bool = False,
    ) -> None:
        if grid_size < 2:
            raise ConfigError(f"env grid_size={grid_size}: expected at least 2 points per axis")
        self.base, self.compliance, self.slope = float(base), float(compliance), float(slope)
        g = np.linspace(low, high, grid_size)
        x = np.array([(a, b) for a in g for b in g])
        xt, desc = _threshold_target(x, target)
        super().__init__(x, xt, (0.0, 1.0), ("x1", "x2"), desc.replace("x ", "x1 "), confounding, noise,
                         allow_target_outside_pool)

    def eta(self, X: np.ndarray, z: np.ndarray | float) -> np.ndarray:
        return self.base + self.compliance * np.asarray(z) * expit(self.slope * X[:, 0])

    def tau(self, X: np.ndarray) -> np.ndarray:
        return 1.0 + 0.5 * X[:, 0] ** 2 + 0.25 * X[:, 1]

    def f0(self, X: np.ndarray) -> np.ndarray:
        return np.sin(X[:, 0]) + 0.5 * np.cos(X[:, 1])


# -- covariate tables -----------------------------------------------------------------------
def load_covariate_csv(path: str | Path, columns: list[str] | None = None, header: bool = True,
                       delimiter: str = ",") -> tuple[np.ndarray, list[str]]:
    """Read a numeric covariate table; a missing or non-numeric cell raises `DataError` naming it.

    ``columns`` keeps only those columns (by header name), e.g. to leave out treatment and
    outcome columns of an IHDP file. Without a header, columns are named ``x0, x1, ...``.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"covariate file {str(path)!r} does not exist")
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f, delimiter=delimiter) if r and any(c.strip() for c in r)]
    if header:
        if not rows:
            raise DataError(f"covariate file {str(path)!r} is empty")
        names, rows = [c.strip() for c in rows[0]], rows[1:]
    else:
        names = [f"x{i}" for i in range(len(rows[0]))] if rows else []
    if not rows:
        raise DataError(f"covariate file {str(path)!r} has a header but no rows")
    for i, r in enumerate(rows):
        if len(r) != len(names):
            raise DataError(f"covariate file {str(path)!r}: row {i + 1 + header} has {len(r)} cells, "
                            f"the header has {len(names)}")
    keep = list(range(len(names)))
    if columns is not None:
        unknown = [c for c in columns if c not in names]
        if unknown:
            raise DataError(f"covariate file {str(path)!r} has no column {unknown[0]!r}; columns: {', '.join(names)}")
        keep = [names.index(c) for c in columns]
    X = np.empty((len(rows), len(keep)))
    for j_out, j in enumerate(keep):
        missing, bad = [], None
        for i, r in enumerate(rows):
            cell = r[j].strip()
            if cell.lower() in MISSING_TOKENS:
                missing.append(i + 1 + header)
                continue
            try:
                X[i, j_out] = float(cell)
            except ValueError:
                bad = bad or (i + 1 + header, cell)
        if bad is not None:
            raise DataError(f"covariate file {str(path)!r}: column {names[j]!r} is not numeric (line {bad[0]} holds "
                            f"{bad[1]!r}); encode it as numbers (one column per category) or leave it out with "
                            "columns=[...]")
        if missing:
            shown = ", ".join(str(m) for m in missing[:5]) + (", ..." if len(missing) > 5 else "")
            raise DataError(f"covariate file {str(path)!r}: column {names[j]!r} has {len(missing)} missing value(s) "
                            f"(lines {shown}); impute or drop those rows, or leave the column out with columns=[...]")
    if not np.all(np.isfinite(X)):
        i, j = np.argwhere(~np.isfinite(X))[0]
        raise DataError(f"covariate file {str(path)!r}: column {names[keep[j]]!r} line {i + 1 + header} is not finite")
    return X, [names[j] for j in keep]


IHDP_CONTINUOUS = ("bw", "b.head", "preterm", "birth.o", "nnhealth", "momage")
IHDP_BINARY = ("sex", "twin", "b.marr", "mom.lths", "mom.hs", "mom.scoll", "cig", "first", "booze", "drugs",
               "work.dur", "prenatal", "ark", "ein", "har", "mia", "pen", "tex", "was")
K401_COLUMNS = ("age", "inc", "educ", "fsize", "marr", "twoearn", "db", "pira", "hown")


def synthetic_covariate_table(kind: str, rng: np.random.Generator, rows: int | None = None) -> tuple[np.ndarray, list[str]]:
    """A generated table with the columns and marginal types of IHDP (747 x 25) or 401(k) (9915 x 9)."""
    if kind == "ihdp":
        n = rows or 747
        # Correlated continuous covariates (already standardised, as in the public IHDP files).
        A = rng.normal(size=(6, 6)) * 0.4 + np.eye(6)
        cont = rng.standard_normal((n, 6)) @ A.T
        cont /= cont.std(axis=0)
        sex, twin, marr = (rng.random(n) < p for p in (0.51, 0.09, 0.52))
        edu = rng.choice(4, size=n, p=[0.37, 0.27, 0.2, 0.16])  # lths, hs, some college, college (baseline)
        habits = [rng.random(n) < p for p in (0.35, 0.46, 0.14, 0.05, 0.55, 0.97)]
        site = rng.choice(8, size=n, p=[0.13, 0.1, 0.16, 0.12, 0.07, 0.16, 0.13, 0.13])  # 8th site is the baseline
        binary = [sex, twin, marr, edu == 0, edu == 1, edu == 2, *habits, *(site == s for s in range(7))]
        X = np.column_stack([cont, *(b.astype(float) for b in binary)])
        return X, [*IHDP_CONTINUOUS, *IHDP_BINARY]
    if kind == "401k":
        n = rows or 9915
        latent = rng.standard_normal(n)  # socio-economic status drives income, education, home ownership
        age = np.clip(np.round(44 + 10 * rng.standard_normal(n)), 25, 64)
        educ = np.clip(np.round(13 + 2.5 * (0.6 * latent + 0.8 * rng.standard_normal(n))), 1, 18)
        marr = rng.random(n) < expit(0.4 + 0.5 * latent)
        twoearn = marr & (rng.random(n) < 0.62)
        inc = np.clip(np.exp(10.3 + 0.55 * latent + 0.3 * twoearn + 0.35 * rng.standard_normal(n)), 0, 250_000)
        fsize = np.clip(1 + rng.poisson(1.9 * marr + 0.4), 1, 13)
        db = rng.random(n) < expit(-1.2 + 0.5 * latent)
        pira = rng.random(n) < expit(-1.4 + 0.8 * latent)
        hown = rng.random(n) < expit(0.5 + 0.7 * latent + 0.02 * (age - 44))
        X = np.column_stack([age, inc, educ, fsize, *(b.astype(float) for b in (marr, twoearn, db, pira, hown))])
        return X, list(K401_COLUMNS)
    raise ConfigError(f"env table={kind!r}: expected 'ihdp' or '401k' (or give csv=PATH)")


class IVTable(IVPopulation):
    """Semi-synthetic: a covariate table with simulated instrument, compliance and outcomes.

    Covariates come from ``csv`` (a user's file, e.g. IHDP's or 401(k)'s covariates) or from
    a generated table shaped like ``table`` (``ihdp`` or ``401k``). ``pool`` rows are drawn,
    standardised, and given: compliance eta = base + compliance * z * sigmoid(slope * c), with
    ``c`` the standardised ``compliance_column``; tau(x) = 1 + tanh(c)/2 + 0.3 sin(u);
    f0(x) = sin(v)/2 + 0.3 c, with ``u``, ``v`` fixed random projections (``seed``). The target
    is the upper (``strong``) or lower (``weak``) quartile of ``c``, or ``all``.

    For example, the IHDP files of the CEVAE repository have no header and the columns
    (t, y_factual, y_cfactual, mu0, mu1, x1..x25): ``csv=ihdp_npci_1.csv, header=false,
    columns=[x5, ..., x29], compliance_column=x5``.
    """

    name = "iv_table"

    def __init__(
        self,
        table: str = "ihdp",
        csv: str | None = None,
        columns: list[str] | None = None,
        header: bool = True,
        pool: int = 500,
        seed: int = 0,
        compliance_column: str | None = None,
        target: str = "strong",
        base: float = -1.0,
        compliance: float = 2.5,
        slope: float = 3.0,
        confounding: float = 1.0,
        noise: float = 0.1,
        allow_target_outside_pool: bool = False,
    ) -> None:
        rng = np.random.default_rng(seed)
        if csv is not None:
            raw, names = load_covariate_csv(csv, columns, header)
            source = Path(csv).name
        else:
            raw, names = synthetic_covariate_table(table, rng)
            source = f"generated {table}-shaped table"
            if columns is not None:
                unknown = [c for c in columns if c not in names]
                if unknown:
                    raise ConfigError(f"env columns: no column {unknown[0]!r} in the {table} table; "
                                      f"columns: {', '.join(names)}")
                raw, names = raw[:, [names.index(c) for c in columns]], list(columns)
        if pool < 10:
            raise ConfigError(f"env pool={pool}: expected at least 10 units")
        if len(raw) < pool:
            warnings.warn(f"iv_table: the table has {len(raw)} rows, fewer than pool={pool}; using all rows",
                          stacklevel=2)
        rows = rng.choice(len(raw), size=min(pool, len(raw)), replace=False)
        X = raw[np.sort(rows)]
        sd = X.std(axis=0)
        constant = [names[j] for j in np.flatnonzero(sd <= 1e-12)]
        if constant:
            warnings.warn(f"iv_table: dropping constant column(s) {', '.join(constant)} (no information)",
                          stacklevel=2)
            keep = sd > 1e-12
            X, sd, names = X[:, keep], sd[keep], [n for n, k in zip(names, keep, strict=True) if k]
        if X.shape[1] == 0:
            raise DataError(f"iv_table: no usable covariate column in {source}")
        X = (X - X.mean(axis=0)) / sd
        default_col = {"ihdp": "bw", "401k": "inc"}.get(table if csv is None else "", names[0])
        ccol = compliance_column or (default_col if default_col in names else names[0])
        if ccol not in names:
            raise ConfigError(f"env compliance_column={ccol!r}: not a column; columns: {', '.join(names)}")
        self.c_index = names.index(ccol)
        self.base, self.compliance, self.slope = float(base), float(compliance), float(slope)
        d = X.shape[1]
        self.w_tau = rng.standard_normal(d) / math.sqrt(d)
        self.w_f0 = rng.standard_normal(d) / math.sqrt(d)
        c = X[:, self.c_index]
        if target == "strong":
            mask, desc = c >= np.quantile(c, 0.75), f"upper quartile of {ccol} (strong compliance)"
        elif target == "weak":
            mask, desc = c <= np.quantile(c, 0.25), f"lower quartile of {ccol} (weak compliance)"
        elif target == "all":
            mask, desc = np.ones(len(X), bool), "the whole pool"
        else:
            raise ConfigError(f"env target={target!r}: expected 'strong', 'weak' or 'all'")
        self.source = source
        super().__init__(X, X[mask], (0.0, 1.0), tuple(names), desc, confounding, noise,
                         allow_target_outside_pool)

    def eta(self, X: np.ndarray, z: np.ndarray | float) -> np.ndarray:
        return self.base + self.compliance * np.asarray(z) * expit(self.slope * X[:, self.c_index])

    def tau(self, X: np.ndarray) -> np.ndarray:
        return 1.0 + 0.5 * np.tanh(X[:, self.c_index]) + 0.3 * np.sin(X @ self.w_tau)

    def f0(self, X: np.ndarray) -> np.ndarray:
        return 0.5 * np.sin(X @ self.w_f0) + 0.3 * X[:, self.c_index]


def make_population(env: str, params: dict[str, Any] | None = None) -> IVPopulation:
    """Build a registered population by name, with its keyword parameters checked."""
    cls = ENVIRONMENTS.get(env)
    if not (isinstance(cls, type) and issubclass(cls, IVPopulation)):
        raise ConfigError(f"environment {env!r} is not an IV population; use iv_1d, iv_multilevel, iv_2d or iv_table")
    try:
        return cls(**(params or {}))
    except TypeError as e:
        raise ConfigError(f"environment {env!r}: bad parameters {sorted(params or {})}: {e}") from e
