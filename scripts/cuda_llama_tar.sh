#!/bin/bash
# Packs the llama.cpp that llama-cpp-python 0.3.36 vendors (its PyPI sdist) as .dev/cuda/llama.tar.xz, the source the
# side-by-side device scripts (cuda_device_s8final.sh) build on the GPU machine, which has no internet. Leaves out the
# docs, test vocabularies and benches (76 MB sdist -> ~9 MB). A second run reuses the download in ~/.cache/splash.
set -euo pipefail
cd "$(dirname "$0")/.."
V=0.3.36; C=${SPLASH_HOME:-$HOME/.cache/splash}/llama-cpp-python-$V.tar.gz; OUT=.dev/cuda/llama.tar.xz
mkdir -p "$(dirname "$C")" .dev/cuda
if [ ! -f "$C" ]; then
  URL=$(curl -fsSL https://pypi.org/simple/llama-cpp-python/ | grep -o "https://[^\"#]*llama_cpp_python-$V.tar.gz" | head -1)
  curl -fsSL -o "$C.part" "$URL" && mv "$C.part" "$C"
fi
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
tar xzf "$C" -C "$T"
tar cJf "$OUT" -C "$T/llama_cpp_python-$V/vendor" --exclude='llama.cpp/models/*.gguf' --exclude='llama.cpp/docs' \
  --exclude='llama.cpp/models/templates' --exclude='llama.cpp/benches' llama.cpp
ls -l "$OUT"
