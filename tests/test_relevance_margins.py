"""benchmarks/relevance_margins.py: a query's distance from a strong match under (λ, M₀, N₀, T₀, A₀), and the rule
that picks the setting meeting the targets whose decisions lie farthest from their thresholds."""
import numpy as np
import pytest

from benchmarks.relevance_margins import (NAMED_FLOOR, SELECTED, Parts, distances, named_top_sweep, query_sets,
                                          search)


def parts(described, null, rq, usable=None, named=None, closest=None) -> Parts:
    described, null = np.atleast_2d(described).astype(float), np.atleast_2d(null).astype(float)
    usable = np.ones(described.shape, bool) if usable is None else np.atleast_2d(usable)
    named = np.zeros(described.shape) if named is None else np.atleast_2d(named).astype(float)
    closest = np.zeros(len(described)) if closest is None else np.asarray(closest, float)
    return Parts(usable, described, np.asarray(rq, float), null, named, closest)


def test_a_distance_is_the_best_hit_passing_every_margin_by_the_smallest_amount():
    p = parts([[-0.30, -0.20]], [[0.10, -0.02]], [0.5])
    # hit 0: min(−0.30 − 0.1·0.5 + 0.4, 0.10 − 0) = 0.05; hit 1: min(−0.20 − 0.05 + 0.4, −0.02) = −0.02
    np.testing.assert_allclose(distances(p, 0.1, -0.4, 0.0, 0.6, -0.1), [0.05])
    # a hit whose photo side is not strong does not count; a query with no such hit is −inf
    np.testing.assert_allclose(distances(parts([[-0.30, -0.20]], [[0.10, -0.02]], [0.5], [[False, True]]), 0.1, -0.4,
                                         0.0, 0.6, -0.1), [-0.02])
    assert distances(parts([[0.0]], [[0.0]], [0.0], [[False]]), 0.0, -1.0, -1.0, 0.6, -0.1)[0] == -np.inf


def test_the_name_margin_counts_only_for_a_query_that_names_a_class():
    # hit 0's name margin −0.3 (its photo's names are far from the query's class), hit 1's −0.05
    p = parts([[-0.30, -0.20]], [[0.10, 0.10]], [0.5], named=[[-0.3, -0.05]], closest=[0.7])
    # the query names a class (t = 0.7 ≥ T₀ = 0.6): hit 0: min(0.05, 0.1, −0.3 + 0.1) = −0.2; hit 1: min(0.15, 0.1,
    # −0.05 + 0.1) = 0.05
    np.testing.assert_allclose(distances(p, 0.1, -0.4, 0.0, 0.6, -0.1), [0.05])
    # with T₀ above t the name margin is not weighed: hit 1: min(0.15, 0.1) = 0.1
    np.testing.assert_allclose(distances(p, 0.1, -0.4, 0.0, 0.75, -0.1), [0.1])
    # a stricter A₀ (0) rejects hit 1 too: the best is −0.05
    np.testing.assert_allclose(distances(p, 0.1, -0.4, 0.0, 0.6, 0.0), [-0.05])


def test_the_rule_prefers_settings_that_meet_the_targets_then_the_widest_nearest_decision():
    # ten captions whose description margins spread over [−0.26, −0.17] and ten absent queries over [−0.40, −0.31]
    present = parts(np.linspace(-0.26, -0.17, 10)[:, None], np.full((10, 1), 0.1), np.zeros(10))
    absent = parts(np.linspace(-0.40, -0.31, 10)[:, None], np.full((10, 1), 0.1), np.zeros(10))
    rows, summary = search({"g": {"present": present, "absent": absent}}, keep=50)
    best = rows[0]
    assert best["meets"] and best["rank"] == 1 and best["per"]["g"]["present"] >= 9 and best["per"]["g"]["absent"] <= 1
    # M₀ in the middle of the gap between −0.31 and −0.26, 0.025 from both (r(q) = 0: any λ)
    assert best["description"] == -0.285 and abs(best["margin"] - 0.025) < 1e-9
    assert (best["per"]["g"]["present"], best["per"]["g"]["absent"]) == (10, 0)
    assert [r["rank"] for r in rows] == list(range(1, 51))
    assert all(r["margin"] <= best["margin"] + 1e-12 for r in rows if r["meets"])
    assert 0 < summary["meeting_targets"] < summary["settings"]


def test_of_the_settings_meeting_the_targets_the_rule_takes_the_fewest_absent_before_the_widest_margin():
    present = parts(np.linspace(-0.26, -0.17, 10)[:, None], np.full((10, 1), 0.1), np.zeros(10))
    # nine absent queries far below the captions and two among them, at −0.258 and −0.257: M₀ = −0.285 keeps every
    # caption with a nearest decision of 0.025 but lets both through; M₀ = −0.255 keeps them out (and 9 captions)
    absent = parts(np.r_[np.linspace(-0.40, -0.31, 8), -0.258, -0.257][:, None], np.full((10, 1), 0.1), np.zeros(10))
    best = search({"g": {"present": present, "absent": absent}})[0][0]
    assert best["description"] == -0.255 and (best["per"]["g"]["present"], best["per"]["g"]["absent"]) == (9, 0)
    assert abs(best["margin"] - 0.002) < 1e-9
    # one absent query more than the fewest counts as as few (ABSENT_SLACK): with one of them the margin decides
    one = parts(np.r_[np.linspace(-0.40, -0.31, 9), -0.258][:, None], np.full((10, 1), 0.1), np.zeros(10))
    best = search({"g": {"present": present, "absent": one}})[0][0]
    assert best["description"] == -0.285 and (best["per"]["g"]["present"], best["per"]["g"]["absent"]) == (10, 1)
    assert abs(best["margin"] - 0.025) < 1e-9


def test_the_rule_weighs_the_names_when_the_other_margins_cannot_separate():
    # absent queries as close to their photos as the captions (the description margin alone cannot tell them apart)
    # but naming a class (t = 0.7) that their photos' names do not carry (−0.25); the captions' names fit (−0.02)
    present = parts(np.linspace(-0.26, -0.17, 10)[:, None], np.full((10, 1), 0.1), np.zeros(10),
                    named=np.full((10, 1), -0.02), closest=np.full(10, 0.7))
    absent = parts(np.linspace(-0.26, -0.17, 10)[:, None], np.full((10, 1), 0.1), np.zeros(10),
                   named=np.full((10, 1), -0.25), closest=np.full(10, 0.7))
    best = search({"g": {"present": present, "absent": absent}})[0][0]
    assert best["meets"] and best["named_floor"] <= 0.7 and -0.25 < best["named"] <= -0.02
    assert (best["per"]["g"]["present"], best["per"]["g"]["absent"]) == (10, 0)
    # the rule without the name term (T₀ above every t) cannot tell them apart
    off = search({"g": {"present": present, "absent": absent}}, floors=np.array([1.01]))[0][0]
    assert off["named_floor"] == 1.01 and not off["meets"]
    # where no setting meets both targets, the first keeps the captions' and lets the fewest absent queries through
    assert off["per"]["g"]["present"] >= 9 and off["per"]["g"]["absent"] <= 9 + 1     # the fewest, 9, and the slack
    # queries that name no class on the grid (t = 0.4, below every T₀) leave the two sets as alike as before
    for p in (present, absent):
        object.__setattr__(p, "closest_class", np.full(10, 0.4))
    assert NAMED_FLOOR.min() > 0.4 and not search({"g": {"present": present, "absent": absent}})[0][0]["meets"]


def test_the_check_set_is_counted_but_never_chosen_on_and_its_floor_is_the_best_any_setting_does():
    present = parts(np.linspace(-0.26, -0.17, 10)[:, None], np.full((10, 1), 0.1), np.zeros(10))
    absent = parts(np.linspace(-0.40, -0.31, 10)[:, None], np.full((10, 1), 0.1), np.zeros(10))
    # a check set right at the chosen M₀ (−0.285) and above it: only a stricter M₀ would keep it out
    check = parts(np.array([-0.285, -0.28, -0.2])[:, None], np.full((3, 1), 0.1), np.zeros(3))
    alone, summary = search({"g": {"present": present, "absent": absent}})
    assert "check_floor" not in summary
    rows, summary = search({"g": {"present": present, "absent": absent, "check": check, "holdout": check}})
    best = rows[0]
    assert {k: best[k] for k in ("weight", "description", "null", "named_floor", "named")} == \
        {k: alone[0][k] for k in ("weight", "description", "null", "named_floor", "named")}
    assert best["margin"] == alone[0]["margin"]         # its distances (0, 0.005) are not the nearest decision
    assert best["per"]["g"]["check"] == best["per"]["g"]["holdout"] == 3     # all three pass M₀ = −0.285
    # keeping 9 of the 10 captions allows M₀ up to −0.25 (the second-lowest caption); one above −0.28 leaves only −0.2
    floor = summary["check_floor"]
    assert floor is not None and floor["per"]["g"]["check"] == 1 and -0.28 < floor["description"] <= -0.25


def test_settings_asked_for_are_reported_wherever_they_rank_and_off_grid_ones_are_refused():
    present = parts(np.linspace(-0.26, -0.17, 10)[:, None], np.full((10, 1), 0.1), np.zeros(10))
    absent = parts(np.linspace(-0.40, -0.31, 10)[:, None], np.full((10, 1), 0.1), np.zeros(10))
    rows, _ = search({"g": {"present": present, "absent": absent}}, keep=3, also=((0.0, -0.45, 0.0, 0.6, -0.1),))
    assert len(rows) == 4
    asked = rows[-1]
    assert (asked["weight"], asked["description"], asked["null"], asked["named_floor"], asked["named"]) == \
        (0.0, -0.45, 0.0, 0.6, -0.1)
    assert not asked["meets"] and asked["per"]["g"]["absent"] == 10 and asked["rank"] > 3
    try:
        search({"g": {"present": present, "absent": absent}}, also=((0.0, -0.451, 0.0, 0.6, -0.1),))
    except SystemExit as e:
        assert "not on the grid" in str(e)
    else:
        raise AssertionError("an off-grid setting was accepted")


def test_the_demo_query_sets_choose_on_present_and_absent_and_keep_the_unseen_and_holdout_sets_apart():
    sets = query_sets()
    assert set(sets) == {"present", "absent", "check", "holdout"} and set(SELECTED) == {"present", "absent"}
    assert (len(sets["present"]), len(sets["absent"]), len(sets["check"]), len(sets["holdout"])) == (20, 127, 45, 50)
    chosen_on = set(sets["present"]) | set(sets["absent"])
    assert not chosen_on & set(sets["check"]) and not chosen_on & set(sets["holdout"])
    assert not set(sets["check"]) & set(sets["holdout"])


def test_the_named_top_sweep_puts_first_the_count_whose_choice_the_rule_puts_first():
    present = parts(np.linspace(-0.26, -0.17, 10)[:, None], np.full((10, 1), 0.1), np.zeros(10))
    absent = parts(np.linspace(-0.40, -0.31, 10)[:, None], np.full((10, 1), 0.1), np.zeros(10))
    # the same parts at two counts, but at count 8 every absent query's name margin is as good as a caption's
    # (text side −0.2, the name term on with t = 0.7): no A₀ keeps them apart, the targets are met without the term
    # and the count whose names separate them (3: absent name margins −0.5) is first
    named = {3: (np.zeros((10, 1)), np.full((10, 1), -0.5)), 8: (np.zeros((10, 1)), np.zeros((10, 1)))}
    swept = {k: {"g": {"present": Parts(present.usable, present.described, present.rq, present.null, p, np.full(10, 0.7)),
                       "absent": Parts(absent.usable, np.full((10, 1), -0.2), absent.rq, absent.null, a,
                                       np.full(10, 0.7))}}
             for k, (p, a) in named.items()}
    rows = named_top_sweep(swept)
    assert [r["named_top"] for r in rows] == [3, 8]
    assert rows[0]["meets"] and rows[0]["per"]["g"]["absent"] == 0 and rows[0]["named_floor"] <= 0.7


def test_the_served_settings_and_count_of_names_are_the_ones_the_committed_results_chose():
    import json
    from pathlib import Path

    from index.relevance import NAMED_TOP, text_side_settings

    data = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results" /
                       "relevance_margins.json").read_text())
    assert {k: data["chosen"][k] for k in text_side_settings()} == pytest.approx(text_side_settings())
    assert data["named_top"][0]["named_top"] == NAMED_TOP
