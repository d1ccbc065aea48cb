"""Per-model selection choices: how a model's Re-Prefill picks chunks where one rule does not serve every model.

``SelectionConfig.follow_top``, ``probe_bits`` and ``local_chunks`` default to
``"auto"``: the values calibrated for the runner's model, and for a model
without them 0 (every selected chunk brings the chunk after it), 4-bit probe
keys and one local chunk.  The choice differs by model, measured on tuning
prompts (``python -m kvstore_tools.selection_study``, 5%, teacher-forced):

- on Gemma 3 270M (three global layers, six chunks each at 2048 tokens),
  pairs everywhere keep 11 of 40 prose questions against 16 for the full
  KV, and no pairs 15, while NIAH needs the chunk after the needle's
  (no pairs: 25 of 40, pairs: 40); pairing only the best chunk keeps 14
  and 40 (docs/serving.md);
- on Gemma 3 270M the evidence of a prose question is in the first global
  layer's set in 57% of 120 tuning questions with 4-bit probe keys and 75%
  with 8-bit ones, and with it forced into every set the answers exceed the
  full KV's (63 against 49): 8-bit probe keys keep 46 against 41, and
  leaving the last chunk to the scores (its rows are every sliding layer's
  window) 48, while NIAH and the pass key keep what they kept; 8-bit keys
  cost the three global layers 1.5 MiB a 2k-token prefix, beside the
  sliding layers' 7.5 MiB tail;
- SmolLM2-135M keeps its calibrated default (pairs everywhere), which its
  accuracy tables were measured with.

``SelectionProfile`` is that choice with how it was made, a JSON file
(``version``ed) shipped in ``calibrations/`` as
``<model>-<dtype>.selection.json`` and matched by the model's fingerprint,
like the stand-in layers (``model.standins``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from .profile_file import ProfileError, packaged_path, read_profile_text

PROFILE_VERSION = 1


@dataclass(frozen=True)
class SelectionProfile:
    model_fingerprint: str
    follow_top: int  # only this many best-ranked chunks bring followers (0: every one)
    calibration: dict = field(default_factory=dict)  # how it was chosen: tasks, seeds, tokens, budget, answers kept
    probe_bits: int | None = None  # the width of the resident probe keys; None: not calibrated (4)
    local_chunks: int | None = None  # the last chunks always loaded; None: not calibrated (1)
    version: int = PROFILE_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str, *, model_fingerprint: str | None = None) -> SelectionProfile:
        try:
            raw = json.loads(text)
            if raw.get("version") != PROFILE_VERSION:
                raise ProfileError(f"selection profile version {raw.get('version')!r}, this reader knows {PROFILE_VERSION}")
            top = raw["follow_top"]
            if isinstance(top, bool) or not isinstance(top, int) or top < 0:
                raise ValueError(f"follow_top must be an integer >= 0, got {top!r}")
            bits = raw.get("probe_bits")
            if bits is not None and (isinstance(bits, bool) or bits not in (4, 8)):
                raise ValueError(f"probe_bits must be 4 or 8, got {bits!r}")
            local = raw.get("local_chunks")
            if local is not None and (isinstance(local, bool) or not isinstance(local, int) or local < 0):
                raise ValueError(f"local_chunks must be an integer >= 0, got {local!r}")
            prof = cls(
                model_fingerprint=str(raw["model_fingerprint"]),
                follow_top=top,
                calibration=dict(raw.get("calibration", {})),
                probe_bits=bits,
                local_chunks=local,
            )
        except ProfileError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ProfileError(f"selection profile is malformed: {exc}") from None
        if model_fingerprint and prof.model_fingerprint != model_fingerprint:
            raise ProfileError(
                f"selection profile was made for model {prof.model_fingerprint[:12]}, not this one ({model_fingerprint[:12]})"
            )
        return prof

    @classmethod
    def load(cls, path, *, model=None) -> SelectionProfile:
        """Read ``path``; with ``model`` (a ``Decoder``), refuse a file made for another model."""
        text = read_profile_text(path, "selection profile")
        return cls.from_json(text, model_fingerprint=None if model is None else model.fingerprint)


def packaged_selection(model) -> SelectionProfile | None:
    """The selection profile shipped for ``model`` (a ``Decoder``, matched by fingerprint), or None."""
    path = packaged_path("*.selection.json", model.fingerprint)
    return None if path is None else SelectionProfile.load(path, model=model)


def calibrated_probe_bits(model, profile: SelectionProfile | None | str = "shipped") -> int:
    """The probe-key width ``probe_bits="auto"`` reads for ``model``: its profile's (by default the shipped
    one; a profile given needs no model), 4 without one."""
    profile = packaged_selection(model) if profile == "shipped" else profile
    return 4 if profile is None or profile.probe_bits is None else profile.probe_bits
