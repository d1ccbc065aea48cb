"""The Re-Prefill request's vocabulary: ``Budget``, the frozen sub-configs, named systems and their old names."""

import dataclasses
import re
import warnings

import pytest

from engine_client.reprefill import DEFAULT_SYSTEM, Budget, ReprefillConfig, parse_system
from engine_client.reprefill.config import AttentionConfig, SelectionConfig
from engine_client.reprefill.systems import ALIASES, BASES, canonical, is_system, known_systems
from engine_client.selection import SELECTORS, PeriodInputs, budget_count, plan_periods
from kvstore.contract.errors import InvalidArgument


def test_a_budget_says_whether_it_is_a_fraction_or_a_count():
    assert Budget.fraction(1.0).is_all and not Budget.chunks(1).is_all  # all chunks, against one chunk
    assert budget_count(19, Budget.fraction(1.0)) == 19 and budget_count(19, Budget.chunks(3)) == 3
    assert plan_periods(2, 19, Budget.fraction(0.25), period_layers=1).periods == plan_periods(2, 19, 0.25, period_layers=1).periods
    assert Budget.parse("5%") == Budget.parse("0.05") == Budget.fraction(0.05) and Budget.parse("12c") == Budget.chunks(12)
    assert str(Budget.fraction(0.05)) == "0.05" and str(Budget.chunks(12)) == "12c"
    assert Budget.fraction(0.25).scaled(2.0) == Budget.fraction(0.5) and Budget.fraction(0.75).scaled(2.0).is_all
    for bad in (
        lambda: Budget.fraction(0),
        lambda: Budget.fraction(1.5),
        lambda: Budget.fraction(float("nan")),
        lambda: Budget.fraction(True),
    ):
        with pytest.raises(InvalidArgument, match="^budget: a fraction must be in"):
            bad()
    for bad in (lambda: Budget.chunks(0), lambda: Budget.chunks(2.0), lambda: Budget(3, "tokens"), lambda: Budget.parse("lots")):
        with pytest.raises(InvalidArgument, match="^budget: "):
            bad()


def test_the_default_is_the_system_that_keeps_the_answer():
    cfg = ReprefillConfig()
    assert cfg == parse_system(DEFAULT_SYSTEM)
    sel = cfg.selection
    assert (sel.selector, sel.head_aggregation, sel.follow, sel.sink_chunks) == ("exact", "max", 1, 1)
    # the model's selection profile (model.selection_profile); without one: every chunk pairs, 4 bits, one local chunk
    assert sel.follow_top == sel.probe_bits == sel.local_chunks == "auto"
    assert cfg.schedule.period_layers == 1 and cfg.attention.standin_layers == "auto" and cfg.budget == Budget.fraction(0.05)
    assert cfg.uses_calibrated_layers and not cfg.needs_calibrated_layers  # without a calibration file: no stand-ins, said once
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.budget = Budget.fraction(0.1)


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"selector": "oracle"}, "selector"),
        ({"head_aggregation": "mean"}, "head_aggregation"),
        ({"follow": -1}, "follow"),
        ({"follow_top": -1}, "follow_top"),
        ({"follow_top": "calibrated"}, "follow_top"),
        ({"follow_top": True}, "follow_top"),
        ({"page_chunks": 4}, "page_chunks"),  # with the default follow=1
        ({"probe_bits": 3}, "probe_bits"),
        ({"selector": "summary", "probe_bits": 4}, "probe_bits"),  # quantized keys serve exact only: said, not ignored
        ({"probe_bits": "some"}, "probe_bits"),
        ({"local_chunks": "some"}, "local_chunks"),
        ({"local_chunks": -1}, "local_chunks"),
        ({"selector": "recent", "probe_bits": 0, "per_head": True}, "per_head"),
        ({"period_layers": 0}, "period_layers"),
        ({"whole_layers": (1, 1)}, "whole_layers"),
        ({"lookahead": -1.0}, "lookahead"),
        ({"lookahead": 30.0}, "lookahead"),  # more than 1 / budget
        ({"standin_layers": "all"}, "standin_layers"),
        ({"standin_layers": (1,), "period_layers": 2}, "standin_layers"),
        ({"prefill_alpha": 1.5}, "prefill_alpha"),
        ({"reselect_every": -1}, "reselect_every"),
        ({"first_token_full": True}, "first_token_full"),
        ({"selector": "exact", "probe_bits": 0, "reselect_every": 2}, "reselect_every"),  # scores not resident
        ({"whole_layers": "calibrated", "streaming": True}, "whole_layers"),
        ({"budget": 1}, "budget"),  # an int would be a count or everything: Budget.chunks(n) says which
        ({"budget_fraction": 0.1}, "budget_fraction"),
    ],
)
def test_a_field_out_of_range_is_refused_when_the_config_is_made_in_one_line_naming_it(fields, field):
    with pytest.raises(InvalidArgument) as err:
        ReprefillConfig().replace(**fields)
    assert err.value.field == field and "\n" not in str(err.value)


def test_flat_fields_reach_their_sub_config_and_nested_ones_can_be_given_whole():
    cfg = ReprefillConfig().replace(budget=0.1, period_layers=2, standin_layers=(), reselect_every=4, speculate=False)
    assert cfg.budget == Budget.fraction(0.1) and cfg.schedule.period_layers == 2 and cfg.decode.reselect_every == 4
    assert not cfg.fetch.speculate and cfg.flat("reselect_every") == 4
    assert parse_system("summary").replace(**cfg.flat_fields()) == cfg  # the flat record a trace keeps says it all
    nested = ReprefillConfig(budget=Budget.chunks(3), selection=SelectionConfig(follow=0), attention=AttentionConfig(standin_layers=()))
    assert nested.selection.follow == 0 and nested.budget.unit == "chunks"
    with pytest.raises(InvalidArgument, match="^selection: must be a SelectionConfig"):
        ReprefillConfig(selection={"selector": "exact"})


def test_every_old_name_parses_to_its_new_spelling_and_says_so():
    for old, new in ALIASES.items():
        with pytest.warns(DeprecationWarning, match=re.escape(f"{old!r} is now {new!r}")):
            assert parse_system(old) == parse_system(new)
        assert canonical(old) == new and is_system(old) and old in known_systems()
    layerwise = parse_system("exact+period=2+heads=max")
    assert (layerwise.selection.selector, layerwise.schedule.period_layers, layerwise.selection.head_aggregation) == ("exact", 2, "max")
    assert parse_system("ckv+int4-probes+standins=calibrated").attention.standin_layers == "calibrated"


def test_modifiers_set_one_thing_each_and_bases_name_the_rest():
    cfg = parse_system("ckv+int4-probes+standins=8/19+query=last:16", budget=Budget.fraction(0.1))
    assert cfg.selection.probe_bits == 4 and cfg.attention.standin_layers == (8, 19) and cfg.selection.select_queries == 16
    assert cfg.budget == Budget.fraction(0.1) and cfg.selection.follow == 1  # the base's
    assert parse_system("lserve+per-head").selection.per_head and parse_system("quest+reselect=4").decode.reselect_every == 4
    assert parse_system("summary+speculate=off+overlap=off").fetch == dataclasses.replace(
        ReprefillConfig().fetch, speculate=False, overlap=False
    )
    assert set(BASES) >= set(SELECTORS) | {"ckv", "quest", "lserve", "loopserve"}
    assert parse_system("ckv+follow-top=1").selection.follow_top == 1 and parse_system("ckv+follow-top=auto") == parse_system("ckv")
    with pytest.raises(InvalidArgument, match="follow_top"):
        parse_system("ckv+follow-top=-1")
    for bad in (
        "oracle",
        "ckv+nope",
        "ckv+follow",
        "ckv+follow-top=some",
        "ckv+query=first:3",
        "ckv+streaming=maybe",
        "",
        "ckv+first=half",
    ):
        with pytest.raises(InvalidArgument) as err:
            parse_system(bad)
        assert err.value.field == "system" and "\n" not in str(err.value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not is_system("perlayer-follow-int4-standin-extra") and is_system("perlayer-follow-int4")  # no warning


@pytest.mark.parametrize("name", sorted(SELECTORS))
def test_every_selector_scores_from_what_it_declares_it_needs(name):
    """The contract the runner relies on: inputs carrying only what ``needs`` names are enough to score."""
    import torch

    from engine_client.selection import KEY_SUMMARIES, PROBE_KEYS, get_selector

    gen = torch.Generator().manual_seed(0)
    q, keys = torch.randn(4, 3, 8, generator=gen), torch.randn(2, 37, 8, generator=gen)  # 4 query heads over 2 KV heads; 3 chunks of 16
    sel = get_selector(name, "max" if name in ("exact", "summary") else "sum")
    inputs = PeriodInputs(q, chunk_tokens=16, chunk_count=3)
    if PROBE_KEYS in sel.needs:
        inputs = dataclasses.replace(inputs, probe_keys=keys)
    if KEY_SUMMARIES in sel.needs:
        chunks = torch.nn.functional.pad(keys, (0, 0, 0, 11)).reshape(2, 3, 16, 8)  # padding zeros join the last chunk's bounds
        inputs = dataclasses.replace(inputs, key_min=chunks.amin(2).transpose(0, 1), key_max=chunks.amax(2).transpose(0, 1))
    scores = sel.score(inputs)
    assert scores.shape == (3,) and not torch.isnan(scores).any()
    assert sel.per_head == hasattr(sel, "head_scores")
