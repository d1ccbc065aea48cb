"""Cost of converting between a paged engine KV cache and the store's pages.

    python -m kvstore_tools.bench.page_layout [--pages 1000] [--layers 28] [--kv-heads 4] [--head-dim 128]
                                     [--block-size 16] [--dtype bfloat16] [--repeat 3] [--threads N]

Times ``engine_client.pages.gather_pages`` (vLLM's per-layer
``[2, blocks, block_size, heads, dim]`` caches -> ``[pages, layers, 2, heads,
block_size, dim]``, what a save sends) and ``scatter_pages`` (the way back,
what a load does), on the CPU with torch; prints the median of ``--repeat``
runs and the bandwidth.  The defaults are Qwen2.5-7B's KV geometry.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def run(pages: int, layers: int, kv_heads: int, head_dim: int, block_size: int, dtype: str, repeat: int) -> dict:
    import torch

    from engine_client.pages import gather_pages, scatter_pages

    tdtype = getattr(torch, dtype)
    num_blocks = pages + 8
    caches = [torch.randn(2, num_blocks, block_size, kv_heads, head_dim).to(tdtype) for _ in range(layers)]
    block_ids = torch.randperm(num_blocks)[:pages]
    out = torch.empty((pages, layers, 2, kv_heads, block_size, head_dim), dtype=tdtype)
    gather_pages(caches, block_ids[:1], out[:1])  # first calls pay one-time set-up: not timed
    scatter_pages(out[:1], caches, block_ids[:1])
    gather_s, scatter_s = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        gather_pages(caches, block_ids, out)
        gather_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        scatter_pages(out, caches, block_ids)
        scatter_s.append(time.perf_counter() - t0)
    for layer, cache in enumerate(caches):  # the way back restores the blocks exactly
        if not torch.equal(cache[:, block_ids].permute(1, 0, 3, 2, 4), out[:, layer]):
            raise AssertionError("scatter_pages did not restore the gathered blocks")
    nbytes = out.numel() * out.element_size()
    return {
        "pages": pages,
        "page_bytes": nbytes // pages,
        "bytes": nbytes,
        "threads": torch.get_num_threads(),
        "gather_ms": statistics.median(gather_s) * 1e3,
        "scatter_ms": statistics.median(scatter_s) * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvstore_tools.bench.page_layout", description=__doc__.splitlines()[0])
    p.add_argument("--pages", type=int, default=1000)
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    r = run(args.pages, args.layers, args.kv_heads, args.head_dim, args.block_size, args.dtype, args.repeat)
    mib = r["bytes"] / 2**20
    print(
        f"{r['pages']} pages of {r['page_bytes'] / 1024:.0f} KiB ({mib:.0f} MiB), "
        f"{args.layers} layers x {args.kv_heads} KV heads x {args.head_dim} dim {args.dtype}, block {args.block_size}, "
        f"{r['threads']} threads"
    )
    for name in ("gather", "scatter"):
        ms = r[f"{name}_ms"]
        print(f"{name:8s} {ms:9.1f} ms  {ms / r['pages'] * 1e3:7.1f} us/page  {mib / 1024 / (ms / 1e3):6.2f} GiB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
