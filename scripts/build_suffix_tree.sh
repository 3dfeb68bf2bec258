#!/usr/bin/env bash
# Builds only arctic-inference's suffix tree (csrc/suffix_decoding: C++20, nanobind, CMake; no CUDA, no torch) into
# the venv that `PYTHON` runs, as an `arctic_inference` package without dist-info: vLLM's suffix decoding
# (`speculative_config={"method": "suffix"}`, our `--rollout_reuse suffix`) imports
# `arctic_inference.suffix_decoding.SuffixDecodingCache`, and nothing of arctic-inference's vLLM plugin is installed
# (no dist-info, so no `vllm.general_plugins` entry point of its own).
# arctic-inference is Apache-2.0 (Snowflake Inc.); PyPI has it as an sdist only, whose full build needs CUDA and torch.
# Run by `bash scripts/install.sh`, and on GPU nodes as `PYTHON=$(which python) bash scripts/build_suffix_tree.sh`
# (docs/install.md, "Suffix decoding on GPUs").
set -euo pipefail
PYTHON=${PYTHON:-python}
VERSION=0.3.0
SHA256=7f22e3e1b1071c6061c0d6951be17c0fb50b08d06d6e543144c8f52faba60a36
WORK=${SUFFIX_BUILD_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/specrl_openrlhf/suffix-build}
TARGET=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
EXT=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
if "$PYTHON" -c 'import arctic_inference.suffix_decoding' 2>/dev/null; then
  echo "[suffix] arctic_inference.suffix_decoding is importable already"; exit 0
fi
mkdir -p "$WORK"
if [ ! -x "$WORK/tools/bin/python" ]; then  # build tools, apart from the venv: nanobind's CMake files, pip's wheel
  python3 -m venv "$WORK/tools"
fi
"$WORK/tools/bin/python" -m pip install -q --disable-pip-version-check "nanobind==2.9.2" wheel "setuptools>=61"
SDIST="$WORK/arctic_inference-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
  # pip runs the sdist's metadata step, whose setup.py imports torch (for its CUDA ops): an empty stand-in will do,
  # and no build isolation (which would install torch >= 2.10 and grpcio-tools to read the metadata)
  stub=$(mktemp -d)
  : > "$stub/torch.py"
  echo "arctic-inference==$VERSION --hash=sha256:$SHA256" > "$stub/req.txt"
  PYTHONPATH="$stub" "$WORK/tools/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
    --no-build-isolation --no-binary arctic-inference -r "$stub/req.txt" -d "$WORK" 2>&1 | grep -v "is ignored" || true
  rm -rf "$stub"
  mv "$WORK"/arctic[-_]inference-"$VERSION".tar.gz "$SDIST" 2>/dev/null || true
fi
echo "$SHA256  $SDIST" | sha256sum -c --quiet -
SRC="$WORK/src"
rm -rf "$SRC" "$WORK/cmake"
mkdir -p "$SRC"
tar -xzf "$SDIST" -C "$SRC" --strip-components=1 --wildcards '*/LICENSE' '*/arctic_inference/__init__.py' \
  '*/arctic_inference/suffix_decoding/__init__.py' '*/arctic_inference/suffix_decoding/cache.py' \
  '*/csrc/suffix_decoding/*'
echo "[suffix] building arctic-inference $VERSION's suffix tree for $("$PYTHON" -c 'import sys; print(sys.executable)')"
cmake -S "$SRC/csrc/suffix_decoding" -B "$WORK/cmake" -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$("$PYTHON" -c 'import sys; print(sys.executable)')" \
  -Dnanobind_DIR="$("$WORK/tools/bin/python" -m nanobind --cmake_dir)" > "$WORK/cmake.log" 2>&1 || {
  cat "$WORK/cmake.log"; exit 1; }
cmake --build "$WORK/cmake" -j "${JOBS:-2}" >> "$WORK/cmake.log" 2>&1 || { cat "$WORK/cmake.log"; exit 1; }
rm -rf "$TARGET/arctic_inference"
mkdir -p "$TARGET/arctic_inference/suffix_decoding"
cp "$SRC/LICENSE" "$SRC/arctic_inference/__init__.py" "$TARGET/arctic_inference/"
cp "$SRC/arctic_inference/suffix_decoding/__init__.py" "$SRC/arctic_inference/suffix_decoding/cache.py" \
  "$WORK/cmake/_C$EXT" "$TARGET/arctic_inference/suffix_decoding/"
"$PYTHON" -c 'from arctic_inference.suffix_decoding import SuffixDecodingCache; SuffixDecodingCache(24, 100)'
echo "[suffix] installed into $TARGET/arctic_inference (no dist-info, so no vLLM plugin of arctic-inference's)"
