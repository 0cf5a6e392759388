"""The a8 default's choice record (scripts/docs/choice_record.py): a8's list against q4's on both splits,
recomputed from the shipped artifacts, is within noise (issue 57)."""

import choice_record as c


def test_a8_against_q4_is_not_significant_on_either_split():
    tune = c.a8_over_q4(c.load(c.TUNE), c.TUNE)
    fresh = c.a8_over_q4(c.load(c.FRESH), c.FRESH)
    assert c.words(tune) == "1.048× (95% CI 0.99–1.11×, 23 prompts): not significant"
    assert c.words(fresh) == "1.038× (95% CI 0.98–1.10×, 28 prompts): not significant"
    assert round(c.old_default_over_plain_q4(c.load(c.FIRST_FRESH))["geomean"], 2) == 0.91


def test_the_bootstrap_calls_a_clear_difference_significant():
    ratios = [1.2, 1.25, 1.18, 1.3, 1.22, 1.27, 1.21, 1.24]
    low, high = c.bootstrap(ratios, resamples=2000)
    assert 1.18 <= low < c.geomean(ratios) < high <= 1.3 and low > 1.0
    assert c.bootstrap(ratios, resamples=2000) == (low, high)  # seeded: the same figures every time
