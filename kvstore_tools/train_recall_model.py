"""Train a small Qwen2 decoder on the synthetic recall tasks, on CPU, and write it as a HF checkpoint.

    python -m kvstore_tools.train_recall_model --out checkpoints/recall-small [--seed 0] [--steps N] [--threads 1]
    python -m kvstore_tools.train_recall_model --measure      # seconds per step at each curriculum length, then exit

The model is a ``Qwen2ForCausalLM`` (GQA, RoPE, SwiGLU, q/k/v bias) whose
weights carry the Hugging Face names that ``engine_client.model.load_checkpoint``
reads; ``forward`` below is the decoder's math (RMSNorm, ``rotate_half`` RoPE,
softmax scale ``1/sqrt(d)``, query head ``h`` on KV head ``h // g``) written
with autograd, and a test checks its logits against ``Decoder.forward_full``.

Training is multi-query associative recall: every sequence carries many
question -> answer pairs (``kvstore_tools.tasks`` training sequences) and the
loss is the cross-entropy at the answer positions only, averaged per task so
that every task weighs the same; an auxiliary ``copy`` task (a random segment
repeated, every repeated token supervised) is in the mix.

Learning recall from scratch stalls on this budget (a 2-core CPU, about half
an hour): trained from a plain random init, the answer accuracy of every task
stayed at chance for the first 300 steps.  So the initialization seeds the
mechanism recall is read with, an induction circuit in layers 0-1 (a
previous-token head and a matching/copying head, ``_init_induction_circuit``),
in an otherwise quiet network (residual projections zero); training then
sharpens it, carries it to 2048 tokens and learns what the circuit does not
do (multi-turn questions asked before their answer is due, few-shot rules).
The card reports the accuracy at step 0 next to the trained one.  Sequences grow over a
curriculum from 256 to 2048 tokens at a constant number of tokens per step;
AdamW with linear warmup and cosine decay.  Everything (initialization, data,
order) follows from ``--seed``: the same seed and step count give the same
checkpoint.

Why one file of ~440 lines: it is the whole recipe of one checkpoint (the
seeded initialization, the autograd forward, the data mix and curriculum,
the schedule and the loop), which ``checkpoints/recall-small/CARD.md`` cites
as one command; the forward is checked against ``Decoder`` by its test, and
the tasks and the model's loader already live in ``engine_client``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from engine_client.model.config import ModelConfig
from engine_client.model.loader import CONFIG_FILE, SINGLE_FILE, expected_tensors
from kvstore_tools import tasks
from kvstore_tools.tasks import vocab


def model_config_dict(num_layers: int = 4) -> dict:
    """``config.json`` of the recall model."""
    if num_layers % 4:
        raise ValueError(f"num_layers must be a multiple of 4 (the store's layer group), got {num_layers}")
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_act": "silu",
        "vocab_size": vocab.VOCAB_SIZE,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "rope_scaling": None,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "attention_dropout": 0.0,
        "torch_dtype": "bfloat16",
    }


COPY = "copy"  # auxiliary training-only task: a random segment repeated, every repeated token supervised


@dataclass
class TrainConfig:
    seed: int = 0
    steps: int = 1100
    num_layers: int = 4
    tokens_per_step: int = 4096  # sequences per step = tokens_per_step // sequence length
    lr: float = 1e-3
    min_lr_fraction: float = 0.05
    warmup_steps: int = 100
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    # (fraction of steps at which the phase ends, sequence lengths drawn in it)
    curriculum: list = field(default_factory=lambda: [(0.2, [256]), (0.4, [512]), (0.6, [1024]), (1.0, [1024, 2048, 2048])])
    task_mix: dict = field(default_factory=lambda: {"kv": 0.4, "multiturn": 0.25, "fewshot": 0.15, COPY: 0.2})
    # One intra-op thread: on a shared 2-core machine two threads stall each other
    # as soon as another process takes a core (measured 7.2 s vs 1.7 s per step).
    threads: int = 1


# ---------------------------------------------------------------------------- model


def init_params(config: ModelConfig, seed: int) -> dict[str, torch.Tensor]:
    """HF tensor name -> float32 leaf tensor: a seeded induction circuit (``_init_induction_circuit``) in a quiet network.

    Projections into the residual stream (``o_proj``, ``down_proj``) start at
    zero outside the circuit, so the residual stream at step 0 carries only
    the token embedding and the circuit; q/k/v and gate/up weights are normal
    with std 0.02; norms 1; biases 0.
    """
    gen = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in sorted(expected_tensors(config).items()):
        if name.endswith("norm.weight"):
            t = torch.ones(shape)
        elif name.endswith(("bias", "o_proj.weight", "down_proj.weight")):
            t = torch.zeros(shape)
        else:
            t = torch.empty(shape).normal_(0.0, 0.02, generator=gen)
        params[name] = t
    if config.attention_bias and config.num_hidden_layers >= 2:
        _init_induction_circuit(params, config, gen)
    return {name: t.requires_grad_(True) for name, t in params.items()}


# The seeded circuit's scales (see _init_induction_circuit).
EMBED_STD = 0.08  # token embeddings, on the first hidden/4 dims only
PREV_TOKEN_BIAS = 5.0  # |q|, |k| per RoPE pair of the previous-token head: ~0.85 of its attention on t-1
MATCH_SCALE = 1.7  # induction head q/k gain: same-token score ~20 against noise ~4 at init
COPY_GAIN = 3.0  # induction head output: the copied token's embedding ~3x the current token's
MAX_MATCH_ROTATION = 1.0  # radians: RoPE pairs that turn less than this over max_position_embeddings/2 carry the match


def _init_induction_circuit(params: dict[str, torch.Tensor], config: ModelConfig, gen: torch.Generator) -> None:
    """Seed layers 0-1 with an induction circuit, the mechanism key-value recall is read with; all of it is then trained.

    Residual stream layout at init: dims ``[0, E)`` hold the token embedding
    (``E = hidden/4``, tied with the LM head), ``[E, 2E)`` the previous
    token, the rest is free.

    * Layer 0, KV head 0 (query heads ``0..g-1``): a previous-token head.  Its
      q/k biases make the score ``a^2/sqrt(d) * sum_i cos((m - n - 1) theta_i)``,
      largest at ``n = m - 1`` for every RoPE frequency; it reads the embedding
      dims and its first query head writes them into ``[E, 2E)``.
    * Layer 1, KV head 0: an induction head.  Queries read the current token,
      keys the previous-token dims, through one orthonormal map onto the
      low-frequency RoPE pairs (which barely turn over the context), so a
      query attends to positions that follow an earlier occurrence of its
      token; values read that position's token and the output writes it into
      the embedding dims, so the LM head predicts it.

    ``QUERY key`` then attends to the value after ``REC key`` and predicts it.
    """
    c = config
    d, half, g, hidden = c.head_dim, c.head_dim // 2, c.num_query_groups, c.hidden_size
    e = min(hidden // 4, d)
    theta = 1.0 / (c.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))  # [d/2]
    emb = params["model.embed_tokens.weight"]
    emb.zero_()
    emb[:, :e].normal_(0.0, EMBED_STD, generator=gen)
    emb_norm = EMBED_STD * math.sqrt(e)  # typical |embedding|
    # layer input rmsnorm(x) = x * sqrt(hidden) / |x|: the embedding part has norm ~sqrt(hidden) at layer 0,
    # ~sqrt(hidden/2) at layer 1 (embedding and previous token of equal norms)
    eye = torch.eye(e)

    l0 = "model.layers.0.self_attn."
    params[l0 + "k_proj.bias"][:half] = PREV_TOKEN_BIAS  # KV head 0: pair i = a + 0j
    for h in range(g):  # the query heads that read KV head 0
        params[l0 + "q_proj.bias"][h * d : h * d + half] = PREV_TOKEN_BIAS * torch.cos(theta)
        params[l0 + "q_proj.bias"][h * d + half : (h + 1) * d] = -PREV_TOKEN_BIAS * torch.sin(theta)
    params[l0 + "v_proj.weight"][:d].zero_()
    params[l0 + "v_proj.weight"][:e, :e] = eye  # value = the (normalized) embedding dims
    params[l0 + "o_proj.weight"][e : 2 * e, :e] = eye * (emb_norm / math.sqrt(hidden))  # query head 0 -> dims [E, 2E)

    l1 = "model.layers.1.self_attn."
    pairs = torch.nonzero(theta * (c.max_position_embeddings / 2) <= MAX_MATCH_ROTATION).flatten()
    dims = torch.cat([pairs, pairs + half])  # both halves of each low-frequency pair
    basis, _ = torch.linalg.qr(torch.randn(e, e, generator=gen))
    t_map = basis[: dims.numel()]  # [r, E] orthonormal rows
    k_w = params[l1 + "k_proj.weight"]
    k_w[:d].zero_()
    k_w[dims, e : 2 * e] = MATCH_SCALE * t_map  # keys: the previous token
    for h in range(g):
        q_w = params[l1 + "q_proj.weight"]
        q_w[h * d : (h + 1) * d].zero_()
        q_w[h * d + dims, :e] = MATCH_SCALE * t_map  # queries: the current token
    params[l1 + "v_proj.weight"][:d].zero_()
    params[l1 + "v_proj.weight"][:e, :e] = eye  # value = the attended position's token
    gain = COPY_GAIN * emb_norm / math.sqrt(hidden / 2)
    for h in range(g):  # the query heads' outputs, averaged, into the embedding dims
        params[l1 + "o_proj.weight"][:e, h * d : h * d + e] = eye * (gain / g)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope_tables(config: ModelConfig, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``[T, d]`` float32, built as the decoder builds them."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = torch.outer(torch.arange(num_tokens, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def forward(
    params: dict[str, torch.Tensor], config: ModelConfig, tokens: torch.Tensor, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """Causal forward of ``tokens [B, T]``; logits ``[B, T, vocab]``, or ``[a, vocab]`` at ``positions`` (``[a, 2]`` rows of (batch, t))."""
    c = config
    b, t = tokens.shape
    hq, hkv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    cos, sin = rope_tables(c, t)
    h = F.embedding(tokens, params["model.embed_tokens.weight"])  # [B, T, hidden]
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        x = _rms_norm(h, params[p + "input_layernorm.weight"], c.rms_norm_eps)
        q = F.linear(x, params[p + "self_attn.q_proj.weight"], params.get(p + "self_attn.q_proj.bias"))
        k = F.linear(x, params[p + "self_attn.k_proj.weight"], params.get(p + "self_attn.k_proj.bias"))
        v = F.linear(x, params[p + "self_attn.v_proj.weight"], params.get(p + "self_attn.v_proj.bias"))
        q = _rope(q.view(b, t, hq, d).transpose(1, 2), cos, sin)  # [B, Hq, T, d]
        k = _rope(k.view(b, t, hkv, d).transpose(1, 2), cos, sin)  # [B, Hkv, T, d]
        v = v.view(b, t, hkv, d).transpose(1, 2)
        g = hq // hkv  # query head h reads KV head h // g
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, Hq, T, d]
        h = h + F.linear(attn.transpose(1, 2).reshape(b, t, hq * d), params[p + "self_attn.o_proj.weight"])
        x = _rms_norm(h, params[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
        mlp = F.silu(F.linear(x, params[p + "mlp.gate_proj.weight"])) * F.linear(x, params[p + "mlp.up_proj.weight"])
        h = h + F.linear(mlp, params[p + "mlp.down_proj.weight"])
    if positions is not None:
        h = h[positions[:, 0], positions[:, 1]]  # [a, hidden]
    lm_head = params["model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"]
    return F.linear(_rms_norm(h, params["model.norm.weight"], c.rms_norm_eps), lm_head).float()


def save_checkpoint(params: dict[str, torch.Tensor], raw_config: dict, out_dir, dtype: torch.dtype = torch.bfloat16) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_FILE).write_text(json.dumps(raw_config, indent=2) + "\n", encoding="utf-8")
    tensors = {name: t.detach().to(dtype).contiguous() for name, t in sorted(params.items())}
    save_file(tensors, str(out / SINGLE_FILE), metadata={"format": "pt"})
    return out


# ---------------------------------------------------------------------------- data and schedule


def sequence_length(cfg: TrainConfig, step: int, rng: np.random.Generator) -> int:
    frac = step / max(1, cfg.steps)
    for end, lengths in cfg.curriculum:
        if frac < end:
            return int(rng.choice(lengths))
    return int(cfg.curriculum[-1][1][-1])


def copy_sequence(rng: np.random.Generator, num_tokens: int) -> tasks.TrainingSequence:
    """BOS and a random segment repeated to fill ``num_tokens``; each token after the first copy is supervised.

    Dense next-token supervision of pure copying grows the previous-token and
    induction heads that key-value recall is read with, far sooner than the
    sparse answers of the recall tasks alone.
    """
    period = int(rng.integers(8, max(9, num_tokens // 2)))
    segment = rng.integers(16, vocab.VOCAB_SIZE, size=period)
    body = np.resize(segment, num_tokens - 1)
    tokens = np.concatenate([[vocab.BOS], body]).astype(np.int64)
    return tasks.TrainingSequence(tokens=tokens, answer_positions=np.arange(period, num_tokens - 1, dtype=np.int64))


def batch(cfg: TrainConfig, step: int, rng: np.random.Generator):
    """``(tokens [B, T], positions [a, 2], targets [a], task index of each answer [a])`` for ``step``."""
    length = sequence_length(cfg, step, rng)
    names = list(cfg.task_mix)
    weights = np.array([cfg.task_mix[n] for n in names], dtype=float)
    rows, positions, task_ids = [], [], []
    for i in range(max(1, cfg.tokens_per_step // length)):
        t = int(rng.choice(len(names), p=weights / weights.sum()))
        seq = copy_sequence(rng, length) if names[t] == COPY else tasks.get_task(names[t]).training_sequence(rng, length)
        rows.append(seq.tokens)
        positions.append(np.stack([np.full(seq.answer_positions.size, i), seq.answer_positions], axis=1))
        task_ids.append(np.full(seq.answer_positions.size, t))
    tokens = torch.from_numpy(np.stack(rows))
    pos = torch.from_numpy(np.concatenate(positions))
    return tokens, pos, tokens[pos[:, 0], pos[:, 1] + 1], torch.from_numpy(np.concatenate(task_ids))


def task_balanced_loss(logits: torch.Tensor, targets: torch.Tensor, task_ids: torch.Tensor, num_tasks: int) -> torch.Tensor:
    """Mean over the tasks present of each task's mean answer cross-entropy.

    Tasks supervise very different numbers of positions per sequence (a copy
    sequence hundreds, a conversation a few dozen); balancing keeps the sparse
    recall answers from being drowned out.
    """
    per_answer = F.cross_entropy(logits, targets, reduction="none")
    counts = torch.bincount(task_ids, minlength=num_tasks).float()
    sums = torch.zeros(num_tasks).index_add_(0, task_ids, per_answer)
    present = counts > 0
    return (sums[present] / counts[present]).mean()


def lr_at(cfg: TrainConfig, step: int) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_fraction + (1 - cfg.min_lr_fraction) * 0.5 * (1 + math.cos(math.pi * frac)))


@torch.no_grad()
def quick_accuracy(params, config: ModelConfig, task: str, num_tokens: int, num_examples: int = 16) -> float:
    """Held-out accuracy with the training forward (a progress signal; the harness is the measurement)."""
    exs = tasks.examples(task, num_examples, num_tokens, seed=10_000)
    right = 0
    for ex in exs:
        toks = torch.from_numpy(np.concatenate([ex.prefix, ex.suffix]))[None]
        logits = forward(params, config, toks, torch.tensor([[0, toks.shape[1] - 1]]))
        right += int(logits[0].argmax()) == ex.answer
    return right / len(exs)


# ---------------------------------------------------------------------------- training


def train(cfg: TrainConfig, out_dir=None, log=print, final_eval: bool = False) -> dict:
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    raw = model_config_dict(cfg.num_layers)
    config = ModelConfig.from_dict(raw)
    params = init_params(config, cfg.seed)
    decay = [t for n, t in params.items() if t.dim() == 2]
    no_decay = [t for n, t in params.items() if t.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.98),
        eps=1e-8,
    )
    rng = tasks.rng_for("train", cfg.seed)
    start = time.perf_counter()
    history = []
    loss_avg, acc_avg = None, {}
    for step in range(cfg.steps):
        tokens, pos, targets, task_ids = batch(cfg, step, rng)
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step)
        logits = forward(params, config, tokens, pos)
        loss = task_balanced_loss(logits, targets, task_ids, len(cfg.task_mix))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), cfg.grad_clip)
        opt.step()
        hits = (logits.argmax(-1) == targets).float()
        loss_value = float(loss.detach())
        loss_avg = loss_value if loss_avg is None else 0.95 * loss_avg + 0.05 * loss_value
        for t, name in enumerate(cfg.task_mix):  # running answer accuracy per task
            sel = hits[task_ids == t]
            if sel.numel():
                acc_avg[name] = float(sel.mean()) if name not in acc_avg else 0.9 * acc_avg[name] + 0.1 * float(sel.mean())
        if step % 25 == 0 or step == cfg.steps - 1:
            elapsed = time.perf_counter() - start
            accs = " ".join(f"{k}={v:.3f}" for k, v in acc_avg.items())
            log(f"step {step:5d} T={tokens.shape[1]:4d} lr={lr_at(cfg, step):.2e} loss={loss_avg:.3f} acc {accs} {elapsed:7.0f}s")
            history.append({"step": step, "seq_tokens": tokens.shape[1], "loss": loss_avg, "acc": dict(acc_avg), "elapsed_s": elapsed})
        if final_eval and step > 0 and step % 200 == 0:
            log(f"  held-out kv@1024 {quick_accuracy(params, config, 'kv', 1024):.2f}")
    wall = time.perf_counter() - start
    summary = {"train_config": asdict(cfg), "wall_time_s": wall, "threads": torch.get_num_threads(), "history": history}
    if out_dir is not None:
        save_checkpoint(params, raw, out_dir)
    log(f"done in {wall:.0f}s")
    if final_eval:
        for task in tasks.TASKS:
            summary[f"quick_{task}@2048"] = quick_accuracy(params, config, task, 2048)
        log("quick held-out accuracy at 2048: " + ", ".join(f"{t}={summary[f'quick_{t}@2048']:.2f}" for t in tasks.TASKS))
    return summary


def measure(cfg: TrainConfig, log=print) -> None:
    """Seconds per step at each sequence length (3 timed steps after one warm-up)."""
    torch.set_num_threads(cfg.threads)
    config = ModelConfig.from_dict(model_config_dict(cfg.num_layers))
    params = init_params(config, cfg.seed)
    opt = torch.optim.AdamW(list(params.values()), lr=1e-4)
    rng = tasks.rng_for("train", cfg.seed)
    for length in (256, 512, 1024, 2048):
        probe = TrainConfig(**{**asdict(cfg), "curriculum": [(1.0, [length])]})
        times = []
        for i in range(4):
            t0 = time.perf_counter()
            tokens, pos, targets, _ = batch(probe, 0, rng)
            t1 = time.perf_counter()
            loss = F.cross_entropy(forward(params, config, tokens, pos), targets)
            opt.zero_grad()
            loss.backward()
            opt.step()
            times.append((t1 - t0, time.perf_counter() - t1))
        data_s = np.mean([t[0] for t in times[1:]])
        step_s = np.mean([t[1] for t in times[1:]])
        log(
            f"T={length:5d} batch={tokens.shape[0]:3d}: data {data_s:.3f}s + step {step_s:.3f}s ({cfg.tokens_per_step / (data_s + step_s):.0f} tok/s)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvstore_tools.train_recall_model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="checkpoint directory (config.json + model.safetensors)")
    parser.add_argument("--seed", type=int, default=TrainConfig.seed)
    parser.add_argument("--steps", type=int, default=TrainConfig.steps)
    parser.add_argument("--layers", type=int, default=TrainConfig.num_layers)
    parser.add_argument("--tokens-per-step", type=int, default=TrainConfig.tokens_per_step)
    parser.add_argument("--lr", type=float, default=TrainConfig.lr)
    parser.add_argument("--threads", type=int, default=TrainConfig.threads)
    parser.add_argument("--measure", action="store_true", help="time one step per curriculum length and exit")
    args = parser.parse_args(argv)
    cfg = TrainConfig(
        seed=args.seed, steps=args.steps, num_layers=args.layers, tokens_per_step=args.tokens_per_step, lr=args.lr, threads=args.threads
    )
    if args.measure:
        measure(cfg, log=lambda s: print(s, flush=True))
        return 0
    if not args.out:
        parser.error("--out is required unless --measure")
    summary = train(cfg, args.out, log=lambda s: print(s, flush=True), final_eval=True)
    (Path(args.out) / "training.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
