"""Bridges from other inference libraries to kvstore.

``transformers_cache``: ``KVStorePrefixCache``, kvstore as a persistent, shared prefix cache of a
Hugging Face ``transformers`` Llama/Qwen2 model.  ``transformers_sparse``: ``SparseReprefill``, the
runner's sparse Re-Prefill (its checks, plan and selection) run inside that model's forward.
``hf_model``: the config, fingerprint and store geometry of such a model, equal to those
``ModelRunner`` gives the same checkpoint.  The two ``transformers_*`` modules are the only ones
of the product that import ``transformers`` (install it with the ``hf`` extra).

This package imports nothing on its own: ``import engine_client.integrations`` costs nothing.
"""
