"""Paged engine caches <-> the store's pages: exact element positions, and the benchmark's smoke run."""

import torch

from engine_client.pages import gather_pages, scatter_pages
from kvstore_tools.bench import page_layout


def test_gather_puts_every_element_where_the_page_layout_says_and_scatter_undoes_it():
    layers, blocks, block_size, heads, dim = 3, 7, 4, 2, 1
    caches = [
        torch.arange(2 * blocks * block_size * heads * dim, dtype=torch.float32).reshape(2, blocks, block_size, heads, dim) + 1000 * l
        for l in range(layers)
    ]
    ids = torch.tensor([5, 0, 3])
    pages = gather_pages(caches, ids)
    assert pages.shape == (3, layers, 2, heads, block_size, dim)  # [pages, layers, K|V, heads, tokens, dim]
    for p, b in enumerate(ids.tolist()):
        for l in range(layers):
            for kv in range(2):
                for h in range(heads):
                    for t in range(block_size):
                        assert pages[p, l, kv, h, t, 0] == caches[l][kv, b, t, h, 0]
    fresh = [torch.zeros_like(c) for c in caches]
    scatter_pages(pages, fresh, ids)
    for c, f in zip(caches, fresh):
        assert torch.equal(f[:, ids], c[:, ids]) and not f[:, [1, 2, 4, 6]].any()


def test_page_layout_benchmark_smoke(capsys):
    assert page_layout.main(["--pages", "5", "--layers", "2", "--kv-heads", "1", "--head-dim", "4", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "5 pages of" in out and "gather" in out and "scatter" in out
