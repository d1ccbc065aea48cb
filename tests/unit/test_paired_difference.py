"""``paired_difference``: a system's accuracy against a reference's on the same examples (Newcombe's method 10)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstore_tools.bench.eval_common import paired_difference

Z = 1.959963984540054  # the exact 97.5% normal quantile, as the published figures use


def _pairs(both, only_system, only_reference, neither):
    system = [True] * both + [True] * only_system + [False] * only_reference + [False] * neither
    reference = [True] * both + [False] * only_system + [True] * only_reference + [False] * neither
    return system, reference


def test_a_published_paired_table():
    """59 both, 6 and 16 discordant, 80 neither: -0.0621 (-0.1186 to -0.0046), as Fagerland et al.'s
    contingencytables package gives for the Newcombe square-and-add interval of this table."""
    r = paired_difference(*_pairs(59, 6, 16, 80), z=Z)
    assert (r["both"], r["only_system"], r["only_reference"], r["neither"]) == (59, 6, 16, 80)
    assert r["difference"] == pytest.approx(-10 / 161)
    assert r["interval"] == pytest.approx([-0.1186, -0.0046], abs=5e-5)


def test_the_same_answers_give_zero_inside_a_narrow_interval():
    r = paired_difference(*_pairs(95, 0, 0, 5))
    assert r["difference"] == 0 and r["interval"][0] < 0 < r["interval"][1] and r["interval"][1] - r["interval"][0] < 0.08
    with pytest.raises(ValueError, match="same examples"):
        paired_difference([True], [True, False])


@given(st.integers(0, 40), st.integers(0, 10), st.integers(0, 10), st.integers(0, 40))
def test_the_interval_holds_the_difference_and_mirrors_when_the_roles_swap(both, only_s, only_r, neither):
    if both + only_s + only_r + neither == 0:
        return
    system, reference = _pairs(both, only_s, only_r, neither)
    r = paired_difference(system, reference)
    lo, hi = r["interval"]
    assert -1 <= lo <= r["difference"] <= hi <= 1
    swapped = paired_difference(reference, system)
    assert swapped["difference"] == pytest.approx(-r["difference"])
    assert swapped["interval"] == pytest.approx([-hi, -lo])
