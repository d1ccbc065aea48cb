"""How far a sparse Re-Prefill is from the exact one (pure, over tensors).

* ``top1_agree``: the same next token as with the full prefix;
* ``kl``: KL(full || sparse) of the next-token distributions, in nats;
* ``chunk_recall``: of the chunks that carry the true top attention mass
  (as many as were selected), the fraction the selection kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Fidelity:
    top1_agree: bool
    kl: float
    chunk_recall: float | None = None


def compare_logits(full: torch.Tensor, sparse: torch.Tensor) -> tuple[bool, float]:
    """``full``, ``sparse``: ``[vocab]`` logits of the same position."""
    p = torch.log_softmax(full.double(), dim=-1)
    q = torch.log_softmax(sparse.double(), dim=-1)
    kl = torch.sum(p.exp() * (p - q)).item()
    return bool(full.argmax() == sparse.argmax()), max(kl, 0.0)


def chunk_recall(selected: torch.Tensor, true_scores: torch.Tensor) -> float:
    """Overlap of ``selected`` chunk ids with the top-``len(selected)`` chunks of ``true_scores [m]``."""
    k = selected.numel()
    top = torch.topk(true_scores, k).indices
    return len(set(selected.tolist()) & set(top.tolist())) / k


def fidelity(full_logits: torch.Tensor, sparse_logits: torch.Tensor, selected=None, true_scores=None) -> Fidelity:
    agree, kl = compare_logits(full_logits, sparse_logits)
    recall = None
    if selected is not None and true_scores is not None:
        recall = sum(chunk_recall(s, t) for s, t in zip(selected, true_scores)) / len(selected)
    return Fidelity(agree, kl, recall)
