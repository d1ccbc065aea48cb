"""Per-model selection choices: the shipped profile, the file's refusals, and what "auto" resolves to."""

import json
from types import SimpleNamespace

import pytest
import torch

from engine_client.model import zoo
from engine_client.model.profile_file import PACKAGED
from engine_client.model.selection_profile import PROFILE_VERSION, SelectionProfile, calibrated_probe_bits, packaged_selection
from engine_client.model.standins import ProfileError
from engine_client.reprefill import ModelRunner, ReprefillConfig, parse_system
from engine_client.reprefill.checks import resolve_selection

GEMMA = PACKAGED / "gemma3-270m-float32.selection.json"


def test_the_profile_shipped_for_gemma3_pairs_only_the_best_chunk_and_says_how_it_was_chosen():
    raw = json.loads(GEMMA.read_text())
    standins = json.loads((PACKAGED / "gemma3-270m-float32.standin_layers.json").read_text())
    assert raw["model_fingerprint"] == standins["model_fingerprint"]  # the same model the stand-in calibration is for
    prof = packaged_selection(SimpleNamespace(fingerprint=raw["model_fingerprint"]))
    assert prof is not None and prof.follow_top == 1 and prof.calibration["stream"] == "tune"
    assert packaged_selection(SimpleNamespace(fingerprint="0" * 64)) is None


def test_auto_probe_bits_and_local_chunks_resolve_from_the_profile_and_an_explicit_value_wins():
    gemma = SelectionProfile.from_json(GEMMA.read_text())
    assert (gemma.probe_bits, gemma.local_chunks) == (8, 0)  # shipped for Gemma 3 (calibration in the file)
    for profile, want in ((None, (4, 1)), (gemma, (8, 0)), (SelectionProfile("ab" * 32, 1), (4, 1))):
        sel = resolve_selection(ReprefillConfig(), profile).selection
        assert (sel.probe_bits, sel.local_chunks) == want
        explicit = resolve_selection(ReprefillConfig().replace(probe_bits=4, local_chunks=2), profile).selection
        assert (explicit.probe_bits, explicit.local_chunks) == (4, 2)
    summary = resolve_selection(ReprefillConfig().replace(selector="summary"), gemma).selection
    assert summary.probe_bits == 0  # a selector that reads no probe keys asks for none
    assert calibrated_probe_bits(SimpleNamespace(fingerprint=gemma.model_fingerprint)) == 8
    assert calibrated_probe_bits(SimpleNamespace(fingerprint="0" * 64)) == 4
    assert parse_system("ckv+probes+standins") == ReprefillConfig() and parse_system("ckv+probes+local=auto") == parse_system("ckv+probes")


def test_a_runner_resolves_auto_from_its_model_s_profile_and_an_explicit_value_wins():
    pm = zoo.load("smollm2-135m", dtype=torch.float32)
    runner = ModelRunner(pm.decoder, client=None)
    assert runner.selection_profile is None and runner.follow_top(ReprefillConfig()) == 0  # SmolLM2: every chunk pairs
    assert runner.follow_top(ReprefillConfig().replace(follow_top=3)) == 3
    made = SelectionProfile(pm.decoder.fingerprint, 2)
    runner = ModelRunner(pm.decoder, client=None, selection_profile=made)
    assert runner.follow_top(ReprefillConfig()) == 2 and runner.follow_top(ReprefillConfig().replace(follow_top=0)) == 0
    assert runner.geometry.probe_bits == 4  # the profile names no width: the stored probe keys are 4-bit
    runner = ModelRunner(pm.decoder, client=None, selection_profile=SelectionProfile(pm.decoder.fingerprint, 0, probe_bits=8))
    assert runner.geometry.probe_bits == 8 and runner.resolve(ReprefillConfig()).selection.probe_bits == 8


@pytest.mark.parametrize(
    "change, message",
    [
        ({"version": 9}, "version 9"),
        ({"follow_top": -1}, "follow_top must be an integer >= 0"),
        ({"follow_top": "1"}, "follow_top must be an integer >= 0"),
        ({"follow_top": True}, "follow_top must be an integer >= 0"),
        ({"model_fingerprint": None, "follow_top": None}, "malformed"),
        ({"probe_bits": 3}, "probe_bits must be 4 or 8"),
        ({"probe_bits": True}, "probe_bits must be 4 or 8"),
        ({"local_chunks": -1}, "local_chunks must be an integer >= 0"),
        ({"local_chunks": 1.0}, "local_chunks must be an integer >= 0"),
    ],
)
def test_a_damaged_profile_is_one_clear_error(change, message):
    raw = {"model_fingerprint": "ab" * 32, "follow_top": 1, "calibration": {}, "version": PROFILE_VERSION, **change}
    with pytest.raises(ProfileError, match=message):
        SelectionProfile.from_json(json.dumps(raw))
    with pytest.raises(ProfileError, match="malformed"):
        SelectionProfile.from_json("{not json")


def test_a_profile_for_another_model_is_refused(tmp_path):
    path = tmp_path / "p.selection.json"
    path.write_text(SelectionProfile("ab" * 32, 1).to_json())
    assert SelectionProfile.load(path).follow_top == 1
    with pytest.raises(ProfileError, match="made for model abababababab, not this one"):
        SelectionProfile.load(path, model=SimpleNamespace(fingerprint="cd" * 32))
    with pytest.raises(ProfileError, match="no selection profile file"):
        SelectionProfile.load(tmp_path / "missing.json")
