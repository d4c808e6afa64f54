#!/usr/bin/env bash
# End-to-end test of `splash serve` with the official client SDKs (pinned in requirements.txt) on the real
# Qwen2.5-Coder-0.5B. Installs the SDKs into $SPLASH_HOME/sdkvenv (default ~/.cache/splash/sdkvenv) once, builds and
# starts the server on a free loopback port, runs the SDK tests, stops the server. Prints "N passed, M failed".
# Without a FILTER it also runs sdk_reasoning.py and sdk_xml_tools.py (thinking-model replies and Qwen3-Coder XML tool
# calls, from the router tests).
# Usage: scripts/e2e/run.sh [--no-build] [FILTER...]   (FILTER: run only checks whose "module.name" contains it,
#        e.g. scripts/e2e/run.sh --no-build sdk_extras)
set -euo pipefail
cd "$(dirname "$0")/../.."
home="${SPLASH_HOME:-$HOME/.cache/splash}"
venv="$home/sdkvenv"
stamp="$venv/.requirements"
if ! cmp -s scripts/e2e/requirements.txt "$stamp" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r scripts/e2e/requirements.txt
    cp scripts/e2e/requirements.txt "$stamp"
fi
if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then
    sed -n '2,8p' "$0"; exit 0
fi
if [[ "${1:-}" == "--no-build" ]]; then
    shift
else
    cargo build --release --locked -p splash-cli
fi
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
log="$(mktemp -d)/serve.log"
key="e2e-key"
source scripts/e2e/serve.sh
trap 'kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true' EXIT
start_serve "$log" target/release/splash --model qwen2.5-coder-0.5b --port "$port" --api-key "$key" \
    --max-context 2048 --served-model-name splash-e2e
SPLASH_URL="http://127.0.0.1:$port" SPLASH_KEY="$key" SPLASH_MODEL=splash-e2e SPLASH_MAX_CONTEXT=2048 \
    "$venv/bin/python" scripts/e2e/main.py "$@"
if [[ $# -eq 0 ]]; then
    # Thinking-model replies through the same SDKs (no served model thinks, so these come from the router's tests;
    # see the script).
    "$venv/bin/python" scripts/e2e/sdk_reasoning.py
    # Qwen3-Coder's XML tool calls through the same SDKs' accumulators (likewise from the router's tests).
    "$venv/bin/python" scripts/e2e/sdk_xml_tools.py
fi
