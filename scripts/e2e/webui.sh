#!/usr/bin/env bash
# Browser test of the web UI: installs playwright-core (pinned, under ~/.cache/splash/webui, never in the checkout)
# and Debian's chromium (apt, when missing), starts `splash serve` on the real Qwen2.5-Coder-0.5B with an API key on a
# free loopback port, and runs scripts/e2e/webui.mjs. Screenshots go to $SPLASH_WEBUI_SHOTS (default
# /tmp/splash-webui-shots). Prints "N passed, M failed".
# Usage: scripts/e2e/webui.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/../.."
home="${SPLASH_HOME:-$HOME/.cache/splash}"
pw="$home/webui"
pin="playwright-core@1.65.1"
if [[ "$(cat "$pw/.pin" 2>/dev/null)" != "$pin" ]]; then
    mkdir -p "$pw"
    npm_config_cache="$pw/npm-cache" npm install --silent --no-save --no-audit --no-fund --prefix "$pw" "$pin" >&2
    echo "$pin" >"$pw/.pin"
fi
chromium="${CHROMIUM:-$(command -v chromium || true)}"
if [[ -z $chromium ]]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    chromium="$(command -v chromium)"
fi
[[ "${1:-}" == "--no-build" ]] || cargo build --release --locked -p splash-cli
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
log="$(mktemp -d)/serve.log"
key="webui-key"
source scripts/e2e/serve.sh
trap 'kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true' EXIT
start_serve "$log" target/release/splash --model qwen2.5-coder-0.5b --port "$port" --api-key "$key"
SPLASH_URL="http://127.0.0.1:$port" SPLASH_KEY="$key" SPLASH_MODEL=qwen2.5-coder-0.5b PLAYWRIGHT_DIR="$pw" \
    CHROMIUM="$chromium" SPLASH_WEBUI_SHOTS="${SPLASH_WEBUI_SHOTS:-/tmp/splash-webui-shots}" \
    node scripts/e2e/webui.mjs
