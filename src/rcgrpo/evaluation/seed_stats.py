"""Statistics for comparing training methods where the training run is the unit.

Episodes of one trained model are not independent evidence about a method: two models trained
with different seeds differ by more than the episodes of one model do. So a comparison pairs two
arms' runs that share everything but the arm (the fine-tuned start and the RL seed), takes one
number per run, and tests the mean of the paired differences with Student's t on n - 1 degrees
of freedom. Its interval covers the mean difference over RL seeds *from the starts used* (the
population the runs were drawn from), not over other starts, models or task pools.

Secondary comparisons are corrected with Holm's step-down method; `power_paired_t` gives the
power of the same test for an effect at a given between-run spread (the spread measured).
Pure Python (math only), so every figure is reproducible from the numbers alone.

    from rcgrpo.evaluation.seed_stats import paired_t, holm
    paired_t([0.5, 0.6, 0.7], [0.4, 0.4, 0.4])   # mean 0.2, t on 2 df
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):  # fmt: skip
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (bisection; p in (0, 1))."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile needs 0 < p < 1, got {p}")
    lo, hi = -1e6, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2.0


@dataclass(frozen=True)
class PairedTest:
    """A paired t-test of mean(a - b): the differences' mean and sample sd, the 95 % interval of
    the mean, t on n - 1 df and the two-sided p-value."""

    n: int
    mean: float
    sd: float
    low: float
    high: float
    t: float
    p: float

    def to_dict(self) -> dict:
        return asdict(self)


def paired_t(a: list[float], b: list[float], level: float = 0.95) -> PairedTest:
    """Paired t-test of a - b (one pair per unit: the same start and seed under two arms)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"paired_t needs two equal-length samples of >= 2, got {len(a)}, {len(b)}")
    d = [x - y for x, y in zip(a, b, strict=True)]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    if sd == 0.0:  # every pair differs by the same amount: no spread to test against
        return PairedTest(n, mean, 0.0, mean, mean, math.copysign(math.inf, mean) if mean else 0.0,
                          0.0 if mean else 1.0)  # fmt: skip
    se = sd / math.sqrt(n)
    t = mean / se
    half = t_quantile(0.5 + level / 2.0, n - 1) * se
    p = 2.0 * (1.0 - t_cdf(abs(t), n - 1))
    return PairedTest(n, mean, sd, mean - half, mean + half, t, min(1.0, p))


def holm(pvalues: dict[str, float]) -> dict[str, float]:
    """Holm-adjusted p-values (step-down, family-wise error): the i-th smallest of m is
    multiplied by m - i + 1, then made non-decreasing and capped at 1."""
    order = sorted(pvalues, key=lambda k: pvalues[k])
    m, running, out = len(order), 0.0, {}
    for i, key in enumerate(order):
        running = max(running, min(1.0, (m - i) * pvalues[key]))
        out[key] = running
    return out


def _normal_sf(x: float) -> float:
    return 0.5 * math.erfc(x / math.sqrt(2.0))


def power_paired_t(effect: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t-test at level alpha to detect a mean difference `effect`
    when the differences' sd is `sd`, with n pairs: P(|T'| > t_crit), T' noncentral t with
    noncentrality effect / (sd / sqrt(n)) on n - 1 df, integrated over the chi-square (Simpson
    on s = sqrt(V), 2,000 intervals)."""
    if n < 2:
        raise ValueError(f"power_paired_t needs n >= 2, got {n}")
    if sd <= 0.0:
        return 1.0 if effect else alpha
    nu, delta = n - 1, effect / (sd / math.sqrt(n))
    crit = t_quantile(1.0 - alpha / 2.0, nu)
    top = math.sqrt(nu + 12.0 * math.sqrt(2.0 * nu) + 40.0)
    steps = 2000
    h = top / steps
    log_norm = (nu / 2.0) * math.log(2.0) + math.lgamma(nu / 2.0)

    def integrand(s: float) -> float:
        if s == 0.0:
            return 0.0 if nu > 1 else 2.0 * math.exp(-log_norm)  # limit of f(s^2) * 2s
        v = s * s
        density = math.exp((nu / 2.0 - 1.0) * math.log(v) - v / 2.0 - log_norm) * 2.0 * s
        scale = crit * s / math.sqrt(nu)
        return density * (_normal_sf(scale - delta) + _normal_sf(scale + delta))

    total = integrand(0.0) + integrand(top)
    total += sum((4 if i % 2 else 2) * integrand(i * h) for i in range(1, steps))
    return min(1.0, total * h / 3.0)


def auc(budgets: list[float], values: list[float]) -> float:
    """The area under a curve of `values` measured at increasing `budgets` (trapezoids), divided
    by the budget range: the curve's mean height over the budgets (0..1 for success rates)."""
    if len(budgets) != len(values) or len(budgets) < 2:
        raise ValueError("auc needs >= 2 (budget, value) points")
    if any(b2 <= b1 for b1, b2 in zip(budgets, budgets[1:], strict=False)):
        raise ValueError(f"auc needs increasing budgets, got {budgets}")
    area = sum(
        (budgets[i + 1] - budgets[i]) * (values[i] + values[i + 1]) / 2.0
        for i in range(len(budgets) - 1)
    )
    return area / (budgets[-1] - budgets[0])


def tokens_to(tokens: list[float], values: list[float], threshold: float) -> float | None:
    """The token count at which `values` (one per step, at cumulative `tokens`) first reaches
    `threshold`, linearly interpolated between the two steps around the crossing; None if never."""
    for i, (t, v) in enumerate(zip(tokens, values, strict=True)):
        if v >= threshold:
            if i == 0:
                return float(t)
            t0, v0 = tokens[i - 1], values[i - 1]
            return float(t0 + (threshold - v0) / (v - v0) * (t - t0))
    return None


def moving_mean(values: list[float], window: int) -> list[float]:
    """The mean of each value and the window - 1 before it (fewer at the start)."""
    return [
        sum(values[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1))
        for i in range(len(values))
    ]
