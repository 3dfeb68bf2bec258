"""Shared fixtures. Engine fixtures are session-scoped: a vLLM engine takes 30-40 s to start on CPU."""

import os
import sys
from pathlib import Path

import pytest

STUBS = str(Path(__file__).parent / "stubs")  # flash-attn, so OpenRLHF's CLI module imports on CPU (see its README)

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engines in this process: see miniature/engine.py
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # as OpenRLHF's engines: histories reach proposers
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (STUBS, os.environ.get("PYTHONPATH")) if p)
sys.path.insert(0, STUBS)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from specrl_openrlhf.integration.miniature.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model") / "model")
