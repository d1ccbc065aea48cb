"""Bridges from other inference libraries to kvstore.

``transformers_cache``: ``KVStorePrefixCache``, kvstore as a persistent, shared prefix cache of a
Hugging Face ``transformers`` Llama/Qwen2 model (the only module of the product that imports
``transformers``; install it with the ``hf`` extra).  ``hf_model``: the config, fingerprint and store
geometry of such a model, equal to those ``ModelRunner`` gives the same checkpoint.

This package imports nothing on its own: ``import engine_client.integrations`` costs nothing.
"""
