"""Where the runner's tensors live, and the two crossings between host and device.

Everything the runner keeps or computes is on the model's device (its
weights'): resident state, queries, scores, the loaded rows.  Bytes cross
from the host once per prefix (state) or per delivered group (rows):
``to_device``, non-blocking where the source is pinned.  Chunk ids and
attention masses cross back only where an RPC needs them (``to_host``):
a Period's set sent to the daemon, a look-ahead hint, the attention report.
"""

from __future__ import annotations

import numpy as np
import torch

from kvstore.contract import InvalidArgument

from ..client import to_torch


def resolve_device(model_device: torch.device, device) -> torch.device:
    """The runner's device: the model's, which ``device`` (when given) must name; one line when it cannot."""
    if device is None:
        return torch.device(model_device)
    try:
        want = torch.device(device)
    except (RuntimeError, TypeError):
        raise InvalidArgument("device", f"must name a torch device such as 'cpu' or 'cuda:0', got {device!r}") from None
    if want.type == "cuda" and not torch.cuda.is_available():
        raise InvalidArgument("device", f"{device!r} asked for, but this machine has no CUDA device (torch.cuda.is_available() is False)")
    if want.type != torch.device(model_device).type or (want.index is not None and want != torch.device(model_device)):
        raise InvalidArgument(
            "device", f"the model's weights are on {model_device}, not {device!r}: load it there (load_checkpoint(..., device=))"
        )
    return torch.device(model_device)


def to_device(arr: np.ndarray, dtype: str, device: torch.device) -> torch.Tensor:
    """A delivered array (``dtype`` as the geometry names it) as a tensor on ``device``: a view on the host,
    one copy to an accelerator (non-blocking from pinned memory)."""
    t = to_torch(np.ascontiguousarray(arr), dtype)
    if t.device == device:
        return t
    return t.to(device, non_blocking=t.is_pinned())


def to_host(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as numpy, for an RPC: the one place the runner waits on the device."""
    return t.detach().cpu().numpy()


def wait(t: torch.Tensor) -> torch.Tensor:
    """``t`` once the device has finished the work that makes it: a TTFT read after this counts the GPU's tail
    (kernels are queued, and the clock would stop when the last one is launched, not when it is done)."""
    if t.device.type == "cuda":
        torch.cuda.synchronize(t.device)
    return t
