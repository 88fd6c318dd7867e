"""The script form's words say what follows them."""

from trainfit.render.script import length_words
from trainfit.script.mapping import LengthStats


def _lengths(p95: int, longest: int) -> LengthStats:
    return LengthStats(dataset_samples=100, samples_read=100, sample_min=10, sample_median=50,
                       sample_max=longest, label_max=None, batches_read=50, batches_total=50,
                       batch_quantile_length=p95, batch_max_length=longest, quantile=0.95,
                       padded=True, padding_free=False, longest=longest, all_samples_read=True)


def test_the_p95_grid_is_announced_only_when_it_is_shown():
    """p95 = max = 256: no second grid followed, yet the words said 'the grid is also shown at
    the p95'."""
    same = length_words(_lengths(256, 256), 2, quantile_grid=False)
    assert "also shown" not in same and "no second grid at the p95" in same
    shorter = length_words(_lengths(128, 256), 2, quantile_grid=True)
    assert shorter.endswith("; the grid is also shown at the p95")
    assert "grid" not in length_words(_lengths(128, 256), 2).split(").")[-1]  # tune: no grid
