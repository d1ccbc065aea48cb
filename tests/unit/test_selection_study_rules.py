"""The selection study's rule names: each option parses to the selection it names."""

import pytest

from kvstore_tools.selection_study import parse_rule


def test_rule_options_parse_to_what_they_name():
    # ("select", period layers, follow, scorer, local chunks, cumulative, first layer's share, follow_top,
    #  sink chunks, the question's last queries that score, head aggregation, evidence ranked first)
    assert parse_rule("P1+follow-int4") == ("select", 1, 1, "int4", 1, False, None, None, 1, None, "max", False)
    assert parse_rule("P1-exact") == ("select", 1, 0, "exact", 1, False, None, None, 1, None, "max", False)
    assert parse_rule("P1+lead1-int4")[:8] == ("select", 1, 1, "int4", 1, False, None, 1)  # only the best chunk pairs
    assert parse_rule("P2+follow+nolocal+cum-int4")[:8] == ("select", 2, 1, "int4", 0, True, None, None)
    assert parse_rule("P1+nolocal+nosink+lead1+tail4+hsum-exact")[4:] == (0, False, None, 1, 0, 4, "sum", False)
    assert parse_rule("P1+tail1-int4")[8:] == (1, 1, "max", False)
    assert parse_rule("P1+lead1+oracle-int4")[11] is True
    assert parse_rule("P1+first0.5-int4")[6] == 0.5 and parse_rule("P1+first.67-int4")[6] == 0.67
    assert parse_rule("drop0-14") == ("drop", 0, 14)
    for bad in (
        "P1+cum+nolocal-int4",
        "P1+lead-int4",
        "P1+first1-int4",
        "P0-exact",
        "P1+tail0-int4",
        "P1+hsum+nosink-int4",
        "P1+oracle+hsum-int4",
    ):
        with pytest.raises(ValueError, match="rule"):
            parse_rule(bad)
