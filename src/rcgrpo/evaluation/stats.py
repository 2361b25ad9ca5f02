"""Small statistics for BFCL accuracies: Wilson 95% intervals and the three summaries we report.

* pooled: k / n over all tasks (the paper's "overall", k/80);
* per category: k_c / n_c;
* category mean: the unweighted mean of the category accuracies (BFCL's "multi-turn accuracy").
  Its interval is a Wilson interval with the effective size n_eff = K^2 / sum_c(1/n_c), the n
  for which p(1-p)/n_eff is the variance of an unweighted mean of K proportions sharing p; with
  equal category sizes n_eff = n and it is the pooled interval (our split: 20 per category).

    from rcgrpo.evaluation.stats import wilson
    wilson(68, 80)   # (0.7541..., 0.9117...)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson(k: float, n: float, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for k successes out of n (k may be fractional via n_eff * p).

    Never leaves [0, 1] and is not degenerate at k = 0 or k = n, unlike the normal interval.
    """
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low = 0.0 if k == 0 else max(0.0, centre - half)  # exact ends, not 1 - 1e-16
    high = 1.0 if k == n else min(1.0, centre + half)
    return (low, high)


@dataclass(frozen=True)
class Accuracy:
    """An accuracy with its Wilson 95% interval; `n` may be an effective size."""

    value: float
    low: float
    high: float
    k: float
    n: float

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"{100 * self.value:.2f} [{100 * self.low:.1f}, {100 * self.high:.1f}]"


def accuracy(k: float, n: float) -> Accuracy:
    lo, hi = wilson(k, n)
    return Accuracy(k / n if n else 0.0, lo, hi, k, n)


def summarise(outcomes: list[tuple[str, int]]) -> dict:
    """(category, passed) pairs -> {"pooled", "category_mean", "per_category": {c: Accuracy}}."""
    per: dict[str, list[int]] = {}
    for category, passed in outcomes:
        per.setdefault(category, []).append(int(passed))
    per_category = {c: accuracy(sum(v), len(v)) for c, v in sorted(per.items())}
    pooled = accuracy(sum(sum(v) for v in per.values()), sum(len(v) for v in per.values()))
    if per_category:
        mean = sum(a.value for a in per_category.values()) / len(per_category)
        n_eff = len(per_category) ** 2 / sum(1 / a.n for a in per_category.values())
        lo, hi = wilson(mean * n_eff, n_eff)
        category_mean = Accuracy(mean, lo, hi, mean * n_eff, n_eff)
    else:
        category_mean = accuracy(0, 0)
    return {"pooled": pooled, "category_mean": category_mean, "per_category": per_category}
