"""benchmarks/relevance_margins.py: a query's distance from a strong match under (λ, M₀, N₀), and the rule that
picks the setting meeting the targets whose decisions lie farthest from their thresholds."""
import numpy as np

from benchmarks.relevance_margins import Parts, check_floor, distances, search


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


def test_the_check_set_is_counted_but_never_chosen_on_and_its_floor_is_the_best_any_setting_does():
    present = parts(np.linspace(-0.26, -0.17, 10)[:, None], np.full((10, 1), 0.1), np.zeros(10))
    absent = parts(np.linspace(-0.40, -0.31, 10)[:, None], np.full((10, 1), 0.1), np.zeros(10))
    # a check set right at the chosen M₀ (−0.285) and above it: only a stricter M₀ would keep it out
    check = parts(np.array([-0.285, -0.28, -0.2])[:, None], np.full((3, 1), 0.1), np.zeros(3))
    alone = search({"g": {"present": present, "absent": absent}})[0]
    rows = search({"g": {"present": present, "absent": absent, "check": check}})
    best = rows[0]
    assert (best["weight"], best["description"], best["null"]) == (alone["weight"], alone["description"],
                                                                    alone["null"])
    assert best["margin"] == alone["margin"]            # its distances (0, 0.005) are not the nearest decision
    assert best["per"]["g"]["check"] == 3               # all three pass M₀ = −0.285
    # keeping 9 of the 10 captions allows M₀ up to −0.25 (the second-lowest caption); one above −0.28 leaves only −0.2
    floor = check_floor(rows, present=9)
    assert floor is not None and floor["per"]["g"]["check"] == 1 and -0.28 < floor["description"] <= -0.25
    assert check_floor(search({"g": {"present": present, "absent": absent}}), present=9) is None
