#!/bin/bash
# Packs the llama.cpp that llama-cpp-python 0.3.36 vendors (its sdist) as .dev/cuda/llama.tar.xz, the source that
# scripts/cuda/run.sh builds on the GPU machine (which has no internet) for its side-by-side figures. Leaves out the
# docs, test vocabularies and benches (76 MB sdist -> ~9 MB). The sdist comes through pip's own index configuration
# and is kept in $SPLASH_HOME (default ~/.cache/splash), so a second run downloads nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
V=0.3.36; DIR=${SPLASH_HOME:-$HOME/.cache/splash}/sdist; OUT=.dev/cuda/llama.tar.xz
mkdir -p "$DIR" .dev/cuda
sdist() { find "$DIR" -maxdepth 1 -name "llama[_-]cpp[_-]python-$V.tar.gz" | head -1; }
[ -n "$(sdist)" ] || python3 -m pip download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$V" -d "$DIR"
C=$(sdist); [ -n "$C" ] || { echo "no llama-cpp-python $V sdist in $DIR" >&2; exit 1; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
tar xzf "$C" -C "$T"
tar cJf "$OUT" -C "$T/llama_cpp_python-$V/vendor" --exclude='llama.cpp/models/*.gguf' --exclude='llama.cpp/docs' \
  --exclude='llama.cpp/models/templates' --exclude='llama.cpp/benches' llama.cpp
ls -l "$OUT"
