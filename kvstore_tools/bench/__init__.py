"""``kvstore-bench``: fio-style raw I/O jobs through the store's backend, and
store-level benchmarks (chunked reads; Re-Prefill later).

The entry point is ``kvstore_tools.bench.cli:main``.
"""
