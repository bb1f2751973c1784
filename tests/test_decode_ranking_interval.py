"""benchmarks/decode_ranking.py's paired bootstrap: the interval a difference between two rankings of the same
dev images is read against."""
import torch

from benchmarks.decode_ranking import paired_interval
from training.ranking import KS, summarize


def _rsum(ranks):
    return sum(summarize(r)[f"r{k}"] for r in ranks for k in KS)


def test_identical_rankings_differ_by_nothing_and_a_real_difference_is_bracketed():
    g = torch.Generator().manual_seed(1)
    n = 400
    image_of = torch.arange(n).repeat_interleave(5)
    a = (torch.randint(1, 30, (n,), generator=g), torch.randint(1, 30, (5 * n,), generator=g))
    assert paired_interval(a, a, image_of, draws=200) == [0.0, 0.0]
    worse = (a[0].clone(), a[1].clone())
    worse[0][:12] = 50                                  # 12 images lose every image→text hit
    worse[1][:60] = 50                                  # and their captions their text→image hits
    low, high = paired_interval(a, worse, image_of, draws=400)
    assert 0 < low < _rsum(a) - _rsum(worse) < high     # the difference is inside, and the interval excludes 0
    low_b, high_b = paired_interval(worse, a, image_of, draws=400)
    assert (low_b, high_b) == (-high, -low)             # the other way round: the interval mirrored
