"""Pieces that run only on CPU machines (laptops, CI): the tiny model, vLLM engines with a byte-sized KV cache,
weight reloads, the small GRPO trainer step and the quickstart.

Nothing here is needed on a GPU cluster, where OpenRLHF starts the engines and DeepSpeed trains; the adapters
users run there sit one level up, in `specrl_openrlhf.integration`.
"""
