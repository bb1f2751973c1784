"""The rule of benchmarks/flickr8k_seeds.py that picks the shipped recipe and checkpoint, on made-up rows."""
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "flickr8k_seeds.py"


@pytest.fixture(scope="module")
def seeds():
    spec = importlib.util.spec_from_file_location("flickr8k_seeds", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(recipe, values):
    return [{"recipe": recipe, "seed": s, "rsum_qb": v, "rsum": v - 16, "model": f"{recipe}{s}.pt"}
            for s, v in enumerate(values)]


def test_a_lever_is_adopted_only_beyond_the_seed_noise(seeds):
    noisy = seeds.decide(rows("shipped", [360, 364, 368]) + rows("xbm", [363, 366, 369]))   # +2 against sd 4
    assert noisy["recipe"] == "shipped" and noisy["ship"]["seed"] == 1          # the median seed, not the best
    clear = seeds.decide(rows("shipped", [360, 361, 362]) + rows("xbm", [366, 372, 367]))  # +7.3 against sd 3.2
    assert clear["recipe"] == "xbm" and clear["ship"] == {"seed": 2, "model": "xbm2.pt", "rsum_qb": 367,
                                                          "rsum": 351}
    assert clear["stats"]["xbm"]["mean_qb"] == pytest.approx(368.33, abs=0.01)


def test_only_common_seeds_count_and_one_is_not_enough(seeds):
    one = seeds.decide(rows("shipped", [360, 366, 362]) + rows("xbm", [380]))           # one common seed: no evidence
    assert one["recipe"] == "shipped" and one["ship"]["seed"] == 2                     # median of all shipped seeds
    assert one["stats"]["shipped"]["seeds"] == [0, 1, 2] and one["stats"]["shipped"]["sd_qb"] == 3.06
    assert seeds.decide(rows("xbm", [380, 300]))["ship"] is None
    two = seeds.decide(rows("shipped", [360, 362]) + rows("xbm", [370, 371, 200]))     # seed 2 of xbm unmatched
    assert two["stats"]["xbm"]["seeds"] == [0, 1] and two["recipe"] == "xbm" and two["ship"]["seed"] == 0
