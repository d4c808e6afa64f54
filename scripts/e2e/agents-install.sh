#!/usr/bin/env bash
# Installs the pinned coding-agent clients used by scripts/e2e/agents.sh into $SPLASH_AGENTS_HOME (default
# ~/.cache/splash/agents), never into the checkout: one npm prefix per client (npm's own cache under
# $SPLASH_AGENTS_HOME/npm-cache) and a Python venv for Hermes. Idempotent: a client whose stamp matches its pin is
# skipped. Prints the bin directory to add to PATH on its last line.
# Usage: scripts/e2e/agents-install.sh [claude|codex|opencode|hermes|pi ...]   (default: all)
set -euo pipefail
root="${SPLASH_AGENTS_HOME:-$HOME/.cache/splash/agents}"
mkdir -p "$root/bin" "$root/npm-cache"
export npm_config_cache="$root/npm-cache" npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
# Versions from shared/reference/agent-clients.md (Pi: the newest release that runs on Node 20).
declare -A npm_pkg=(
    [claude]="@anthropic-ai/claude-code@2.1.332"
    [codex]="@openai/codex@0.171.0"
    [opencode]="opencode-ai@1.18.33"
    [pi]="@mariozechner/pi-coding-agent@0.73.1"
)
declare -A npm_bin=([claude]=claude [codex]=codex [opencode]=opencode [pi]=pi)
hermes_pin="hermes-agent==0.19.0"
clients=("$@")
[[ ${#clients[@]} -gt 0 ]] || clients=(claude codex opencode hermes pi)
for c in "${clients[@]}"; do
    if [[ $c == hermes ]]; then
        stamp="$root/hermes/.pin"
        if [[ "$(cat "$stamp" 2>/dev/null)" != "$hermes_pin" ]]; then
            py="${HERMES_PYTHON:-}"
            if [[ -z $py ]]; then
                for v in python3.11 python3.12 python3.13 python3; do
                    command -v "$v" >/dev/null && "$v" -c 'import sys; sys.exit(not ((3,11) <= sys.version_info[:2] < (3,14)))' \
                        && { py="$v"; break; }
                done
            fi
            [[ -n $py ]] || { echo "hermes needs Python 3.11-3.13" >&2; exit 1; }
            echo "installing $hermes_pin with $py" >&2
            "$py" -m venv "$root/hermes"
            PIP_CACHE_DIR="$root/pip-cache" "$root/hermes/bin/pip" install --quiet --disable-pip-version-check "$hermes_pin"
            echo "$hermes_pin" >"$stamp"
        fi
        ln -sf "$root/hermes/bin/hermes" "$root/bin/hermes"
        continue
    fi
    pkg="${npm_pkg[$c]:?unknown client $c (claude codex opencode hermes pi)}"
    stamp="$root/$c/.pin"
    if [[ "$(cat "$stamp" 2>/dev/null)" != "$pkg" ]]; then
        echo "installing $pkg" >&2
        mkdir -p "$root/$c"
        npm install --silent --no-save --prefix "$root/$c" "$pkg" >&2
        echo "$pkg" >"$stamp"
    fi
    ln -sf "$root/$c/node_modules/.bin/${npm_bin[$c]}" "$root/bin/${npm_bin[$c]}"
done
echo "$root/bin"
