"""How many layers of SmolLM2-135M (or a checkpoint) Krul's ``gamma`` leaves input-robust (I-R), on short prose prompts.

    python -m kvstore_tools.krul_ir_layers [--prompts 3] [--tokens 400] [--grid 32] [--gammas 0.5,0.6,0.7,0.8,0.9] [--ratio 0.5]
        [--checkpoint DIR]

``--checkpoint``: an HF checkpoint directory instead (e.g. the Qwen2.5-0.5B
shape of ``kvstore_tools.make_checkpoint``); the prompts are tokenized with
SmolLM2's tokenizer, whose ids fit any larger vocabulary.

Each prompt is ``--tokens`` tokens of consecutive prose sentences of the
offline haystack (``kvstore_tools.tasks.text.haystack``), starting at
sentences 0, 300, 600, ...  For every layer the script computes the causal
attention map ``[9 query heads, n, n]`` from the decoder's own queries
(``layer_queries``) and keys (``layer_forward``'s KV), checks that the map
times the values is the attention output PyTorch's fused kernel gives, and
folds it into one ``krul.AttentionSketch`` per prompt.  It prints each
layer's edge mass per prompt, then per ``gamma`` the number of I-R layers
(edge mass >= gamma) and the strategy's pairs at ``--ratio``.

Prefill only (no decode rows): the statistics of a conversation's first turn.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch
import torch.nn.functional as F

from engine_client.krul import AttentionSketch, choose_strategy
from engine_client.model import zoo
from kvstore_tools.tasks.text.haystack import sentences


def prose_tokens(tokenizer, start: int, num_tokens: int) -> list[int]:
    """``num_tokens`` tokens of the haystack's sentences from sentence ``start`` on."""
    text = ""
    for sentence in sentences()[start:]:
        text += sentence
        ids = tokenizer.encode(text.lstrip())
        if len(ids) >= num_tokens:
            return ids[:num_tokens]
    raise SystemExit(f"the haystack has fewer than {num_tokens} tokens after sentence {start}")


def layer_attention(decoder, tokens: torch.Tensor, sketch: AttentionSketch) -> None:
    """Run the prompt layer by layer, folding each layer's causal attention map into ``sketch``."""
    config = decoder.config
    n = tokens.numel()
    positions = torch.arange(n)
    group = config.num_attention_heads // config.num_key_value_heads
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    hidden = decoder.embed(tokens)
    for layer in range(decoder.num_layers):
        q = decoder.layer_queries(layer, hidden, positions).float()  # [Hq, n, d]
        hidden, kv = decoder.layer_forward(layer, hidden, positions, None)
        keys = kv[0].float().repeat_interleave(group, dim=0)  # [Hq, n, d]: query head h reads KV head h // group
        values = kv[1].float().repeat_interleave(group, dim=0)
        scores = q @ keys.transpose(1, 2) / math.sqrt(config.head_dim)  # [Hq, n, n]
        attn = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        fused = F.scaled_dot_product_attention(q[None], keys[None], values[None], is_causal=True)[0]
        torch.testing.assert_close(attn @ values, fused, rtol=1e-4, atol=1e-4)
        sketch.add_prefill(layer, attn)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvstore_tools.krul_ir_layers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--grid", type=int, default=32)
    parser.add_argument("--gammas", default="0.5,0.6,0.7,0.8,0.9")
    parser.add_argument("--ratio", type=float, default=0.5)
    parser.add_argument("--checkpoint", help="an HF checkpoint directory to measure instead of SmolLM2-135M")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model = zoo.load("smollm2-135m", dtype=torch.float32)
    tokenizer, decoder, name = model.tokenizer, model.decoder, "SmolLM2-135M"
    if args.checkpoint:
        from engine_client.model.loader import load_checkpoint

        try:
            decoder, name = load_checkpoint(args.checkpoint, dtype=torch.float32), args.checkpoint
        except (OSError, ValueError) as exc:
            raise SystemExit(f"--checkpoint {args.checkpoint}: {exc}") from None
    config = decoder.config
    gammas = [float(g) for g in args.gammas.split(",")]
    stats = []
    for p in range(args.prompts):
        tokens = torch.tensor(prose_tokens(tokenizer, 300 * p, args.tokens))
        sketch = AttentionSketch(config.num_hidden_layers, config.num_attention_heads, grid=args.grid)
        layer_attention(decoder, tokens, sketch)
        stats.append(sketch.stats())
    print(f"{name} float32, {args.prompts} prose prompts of {args.tokens} tokens, grid {args.grid}")
    print("edge mass (initial + recent 10% of each row's keys, mean over heads and rows) per layer:")
    print("layer " + " ".join(f"p{p}  " for p in range(args.prompts)))
    for layer in range(config.num_hidden_layers):
        print(f"{layer:5d} " + " ".join(f"{float(s.edge_mass[layer]):.2f}" for s in stats))
    for gamma in gammas:
        print(f"gamma {gamma}:")
        for p, s in enumerate(stats):
            strategy = choose_strategy(s, gamma=gamma, ratio=args.ratio)
            num_ir = config.num_hidden_layers - len(strategy.non_ir)
            print(
                f"  p{p}: {num_ir}/{config.num_hidden_layers} I-R; non-I-R {list(strategy.non_ir)}; pairs at ratio {args.ratio}: {list(strategy.pairs)}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
