"""Test stub for the CUDA-only flash-attn (see tests/stubs/README.md)."""


def _cuda_only(*args, **kwargs):
    raise RuntimeError("flash-attn needs CUDA: this is the CPU test stub (tests/stubs/README.md)")
