"""Stand-in layers kept with a model: the choice from the gains, the file, and the command's refusals."""

import json
import subprocess
import sys

import pytest
import torch

from engine_client.model import zoo
from engine_client.model.loader import load_checkpoint
from engine_client.model.standins import PROFILE_FILE, PROFILE_VERSION, ProfileError, StandinLayers, choose_layers
from kvstore_tools.make_checkpoint import make_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    make_checkpoint(str(path), "tiny", 0, "float32", 1)
    return load_checkpoint(str(path), dtype=torch.float32)


def test_the_largest_gains_above_the_floor_are_kept_in_layer_order():
    gains = [0.05, 0.4, -0.2, 0.76, 0.12, 0.4]
    assert choose_layers(gains, 2, 0.2) == (1, 3)  # 0.76 first, then the tie 0.4 at layers 1 and 5: the lower layer
    assert choose_layers(gains, 3, 0.2) == (1, 3, 5)
    assert choose_layers(gains, 5, 0.5) == (3,)  # the floor leaves one
    assert choose_layers(gains, 0, 0.0) == ()
    assert choose_layers(gains, 2, 1.0) == ()
    with pytest.raises(ValueError, match="max_layers"):
        choose_layers(gains, -1, 0.2)


def _profile(model, layers=(1,), **kw):
    args = dict(gains=(0.1, 0.5), max_layers=2, min_gain=0.2, calibration={"task": "niah"})
    args.update(kw)
    return StandinLayers(model.fingerprint, layers, **args)


def test_the_file_round_trips_and_is_refused_for_another_model_or_depth(tiny, tmp_path):
    assert tiny.num_layers == 2
    prof = _profile(tiny)
    path = prof.save(tmp_path / PROFILE_FILE)
    assert StandinLayers.load(path, model=tiny) == prof
    assert [p.name for p in tmp_path.iterdir()] == [PROFILE_FILE]  # no temporary file left behind
    other = StandinLayers("another", (1,), (0.1, 0.5), 2, 0.2)
    with pytest.raises(ProfileError, match="calibrated for model"):
        StandinLayers.load(other.save(tmp_path / "o.json"), model=tiny)
    deeper = _profile(tiny, gains=(0.1, 0.5, 0.3))
    with pytest.raises(ProfileError, match="gains for 3 layers, the model 2"):
        StandinLayers.load(deeper.save(tmp_path / "d.json"), model=tiny)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(version=PROFILE_VERSION + 1), "version"),
        (dict(layers=[2]), "distinct, in"),
        (dict(layers=[1, 1]), "distinct"),
        (dict(layers=[True]), "malformed"),
        (dict(layers=[0, 1], max_layers=1), "more than its max_layers"),
        (dict(gains=[0.1, float("nan")]), "finite"),
        (dict(gains="ab"), "malformed"),
    ],
)
def test_a_bad_file_is_refused_in_one_line(tiny, tmp_path, change, match):
    raw = json.loads(_profile(tiny).to_json())
    raw.update(change)
    path = tmp_path / PROFILE_FILE
    path.write_text(json.dumps(raw))
    with pytest.raises(ProfileError, match=match) as err:
        StandinLayers.load(path, model=tiny)
    assert "\n" not in str(err.value)
    path.write_text("{")
    with pytest.raises(ProfileError, match="malformed"):
        StandinLayers.load(path)
    with pytest.raises(ProfileError, match="no stand-in layers file"):
        StandinLayers.load(tmp_path / "absent.json")


def test_the_zoo_finds_the_file_next_to_the_checkpoint_or_names_the_command(tiny, tmp_path):
    checkpoint = tmp_path / "smollm2-135m-float32-x"
    checkpoint.mkdir()
    with pytest.raises(ProfileError, match="calibrate-standins smollm2-135m"):
        zoo.standin_layers(tiny, checkpoint)
    prof = _profile(tiny)
    prof.save(checkpoint / PROFILE_FILE)
    assert zoo.standin_layers(tiny, checkpoint) == prof
    elsewhere = _profile(tiny, layers=(0,)).save(tmp_path / "mine.json")
    assert zoo.standin_layers(tiny, checkpoint, elsewhere).layers == (0,)  # an explicit file wins


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--budget", "0"], "must be in (0, 1]"),
        (["--min-gain", "nan"], "must be a finite number"),
        (["--max-layers", "-1"], "must be >= 0"),
        (["--examples", "0"], "must be >= 1"),
        (["--task", "nope"], "invalid choice: 'nope'"),
    ],
)
def test_calibrate_standins_refuses_bad_flags_in_one_line(flags, message):
    out = subprocess.run(
        [sys.executable, "-m", "kvstore_tools.models", "calibrate-standins", "smollm2-135m", *flags], capture_output=True, text=True
    )
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_the_calibration_shipped_for_smollm2_is_found_without_a_file_next_to_the_checkpoint(tmp_path):
    """A fresh machine has no calibration next to the model: the default system still gets its stand-ins."""
    import torch

    from engine_client.model.standins import packaged_standins
    from engine_client.reprefill import ModelRunner

    pm = zoo.load("smollm2-135m", dtype=torch.float32)
    shipped = packaged_standins(pm.decoder)
    assert shipped is not None and shipped.layers == (19,) and shipped.calibration["task"] == "niah"
    assert zoo.standin_layers(pm.decoder, tmp_path / "smollm2-135m-float32-elsewhere") == shipped
    assert ModelRunner(pm.decoder, client=None).standin_profile == shipped
    # another dtype is another model (another fingerprint): nothing shipped, and the command is named
    bf16 = zoo.load("smollm2-135m", dtype=torch.bfloat16)
    assert packaged_standins(bf16.decoder) is None
    with pytest.raises(ProfileError, match="calibrate-standins smollm2-135m"):
        zoo.standin_layers(bf16.decoder, tmp_path / "smollm2-135m-bfloat16-elsewhere")
