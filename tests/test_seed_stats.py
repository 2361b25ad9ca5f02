"""The arena's statistics by hand (rcgrpo.evaluation.seed_stats): Student's t, the paired test,
Holm's correction, the power of the paired test, the area under a budget curve, tokens to a
threshold.

    .venv/bin/pytest tests/test_seed_stats.py -q
"""

from __future__ import annotations

import math

import pytest

from rcgrpo.evaluation.seed_stats import (
    auc,
    holm,
    moving_mean,
    paired_t,
    power_paired_t,
    t_cdf,
    t_quantile,
    tokens_to,
)


def test_t_cdf_by_hand():
    assert t_cdf(1.0, 1) == pytest.approx(0.75, abs=1e-12)  # Cauchy: 1/2 + atan(1)/pi
    assert t_cdf(0.0, 7) == pytest.approx(0.5, abs=1e-12)
    for t in (0.5, 1.0, 3.0, -2.0):  # df 2: 1/2 + t / (2 sqrt(2 + t^2))
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    assert t_quantile(0.975, 2) == pytest.approx(4.302652729749464, abs=1e-9)  # from the df-2 form
    assert t_quantile(0.975, 7) == pytest.approx(2.3646, abs=1e-4)  # the printed table value
    with pytest.raises(ValueError, match="0 < p < 1"):
        t_quantile(1.0, 3)


def test_paired_t_by_hand():
    # differences 1, 2, 3: mean 2, sd 1, se 1/sqrt(3), t = 2 sqrt(3) on 2 df
    r = paired_t([1.5, 2.5, 3.5], [0.5, 0.5, 0.5])
    t = 2 * math.sqrt(3)
    assert (r.n, r.mean, r.sd) == (3, pytest.approx(2.0), pytest.approx(1.0))
    assert r.t == pytest.approx(t)
    p = 2 * (1 - (0.5 + t / (2 * math.sqrt(2 + t * t))))  # = 0.0742
    assert r.p == pytest.approx(p, abs=1e-12) and r.p == pytest.approx(0.0742, abs=1e-4)
    half = 4.302652729749464 / math.sqrt(3)
    assert (r.low, r.high) == (pytest.approx(2 - half), pytest.approx(2 + half))
    same = paired_t([0.5, 0.7], [0.4, 0.6])  # every pair +0.1: no spread
    assert same.sd == 0.0 and same.p == 0.0 and same.low == same.high == pytest.approx(0.1)
    assert paired_t([0.3, 0.3], [0.3, 0.3]).p == 1.0
    with pytest.raises(ValueError, match="equal-length"):
        paired_t([1.0], [0.0])


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 of m = 3: x3 = 0.03, x2 = 0.06, x1 = 0.04 -> raised to 0.06
    assert holm({"a": 0.01, "b": 0.04, "c": 0.03}) == pytest.approx(
        {"a": 0.03, "c": 0.06, "b": 0.06}
    )
    assert holm({"a": 0.5, "b": 0.9}) == {"a": 1.0, "b": 1.0}  # capped at 1
    assert holm({}) == {}


def test_power_of_the_paired_t():
    assert power_paired_t(0.0, 0.2, 8) == pytest.approx(0.05, abs=1e-6)  # no effect: alpha
    assert power_paired_t(0.0, 0.2, 2) == pytest.approx(0.05, abs=1e-4)  # df 1 too
    # n = 8, effect = 1 sd: 0.6808 (the noncentral t with delta sqrt(8), 7 df; G*Power's value)
    assert power_paired_t(0.1, 0.1, 8) == pytest.approx(0.6808, abs=1e-4)
    assert power_paired_t(0.05, 0.1, 8) < power_paired_t(0.1, 0.1, 8) < power_paired_t(0.1, 0.1, 16)
    assert power_paired_t(0.1, 0.0, 8) == 1.0


def test_auc_tokens_to_and_moving_mean_by_hand():
    assert auc([0, 1, 2], [0.0, 1.0, 1.0]) == pytest.approx(0.75)  # (0.5 + 1) / 2
    assert auc([10, 20, 30], [0.4, 0.4, 0.4]) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="increasing"):
        auc([0, 0, 1], [0, 0, 0])
    assert tokens_to([10, 20, 30], [0.2, 0.6, 0.8], 0.5) == pytest.approx(17.5)  # 10 + 0.3/0.4 x 10
    assert tokens_to([10, 20], [0.7, 0.9], 0.5) == 10.0
    assert tokens_to([10, 20], [0.1, 0.2], 0.5) is None
    assert moving_mean([0.0, 0.3, 0.6, 0.9], 3) == pytest.approx([0.0, 0.15, 0.3, 0.6])
