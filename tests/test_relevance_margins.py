"""benchmarks/relevance_margins.py: a query's distance from a strong match under (λ, M₀, N₀), and the rule that
picks the setting meeting the targets whose decisions lie farthest from their thresholds."""
import numpy as np

from benchmarks.relevance_margins import Parts, distances, search


def parts(described, null, rq, usable=None) -> Parts:
    described, null = np.atleast_2d(described).astype(float), np.atleast_2d(null).astype(float)
    usable = np.ones(described.shape, bool) if usable is None else np.atleast_2d(usable)
    return Parts(usable, described, np.asarray(rq, float), null)


def test_a_distance_is_the_best_hit_passing_both_margins_by_the_smaller_amount():
    p = parts([[-0.30, -0.20]], [[0.10, -0.02]], [0.5])
    # hit 0: min(−0.30 − 0.1·0.5 + 0.4, 0.10 − 0) = 0.05; hit 1: min(−0.20 − 0.05 + 0.4, −0.02) = −0.02
    np.testing.assert_allclose(distances(p, 0.1, -0.4, 0.0), [0.05])
    # a hit whose photo side is not strong does not count; a query with no such hit is −inf
    np.testing.assert_allclose(distances(parts([[-0.30, -0.20]], [[0.10, -0.02]], [0.5], [[False, True]]), 0.1, -0.4,
                                         0.0), [-0.02])
    assert distances(parts([[0.0]], [[0.0]], [0.0], [[False]]), 0.0, -1.0, -1.0)[0] == -np.inf


def test_the_rule_prefers_settings_that_meet_the_targets_then_the_widest_nearest_decision():
    # ten captions whose description margins spread over [−0.26, −0.17] and ten absent queries over [−0.40, −0.31]
    present = parts(np.linspace(-0.26, -0.17, 10)[:, None], np.full((10, 1), 0.1), np.zeros(10))
    absent = parts(np.linspace(-0.40, -0.31, 10)[:, None], np.full((10, 1), 0.1), np.zeros(10))
    rows = search({"g": {"present": present, "absent": absent}})
    best = rows[0]
    assert best["meets"] and best["per"]["g"]["present"] >= 9 and best["per"]["g"]["absent"] <= 1
    # M₀ in the middle of the gap between −0.31 and −0.26, 0.025 from both (r(q) = 0: any λ)
    assert best["description"] == -0.285 and abs(best["margin"] - 0.025) < 1e-9
    assert (best["per"]["g"]["present"], best["per"]["g"]["absent"]) == (10, 0)
    assert all(r["margin"] <= best["margin"] + 1e-12 for r in rows if r["meets"])
    assert not rows[-1]["meets"]
