#!/usr/bin/env bash
# End-to-end test of `splash claude|codex|opencode|hermes|pi` with the real clients (pinned in agents-install.sh,
# installed under ~/.cache/splash/agents, never in the checkout) against `splash serve` on the real
# Qwen2.5-Coder-0.5B, inside a network namespace with only loopback up (needs root: `unshare -n`).
#
# Each client runs non-interactively through its launcher, in a throwaway HOME that holds a hostile user config
# (settings that would point it elsewhere if the launcher did not override them), in four phases (all clients
# finish a phase before the next starts, so the most important results come first on a slow machine):
#   1. cold turn  "What is the capital of France? ..."  must exit 0 and print the model's answer (checked against the
#      text the server streamed, captured by scripts/e2e/agents_proxy.py between client and server)
#   2. tool turn  "Create a file named hello.txt containing the word hi, using your tools."  reported, not required
#   3. warm turn  "What is 2+3? ..."  same check as 1; its time to first token shows reuse of the client's prompt
#   4. restart turn  "What is 3+4? ..."  after `splash serve` was restarted: same check; its time to first token shows
#      the prefix cache persisted on disk (--prefix-cache-disk)
# All turns of one client run in the same project directory ($work/<client>-project), as a person working in one
# checkout would: the clients write the working directory into their system prompts, so a fresh directory per turn
# would make every turn a cold one. Each turn's output goes to $work/<client>-<turn>/.
# Runs that would start after --deadline-s (default 5400) are skipped and reported as skipped; each run has
# --turn-timeout-s (default 600), the tool turn --tool-timeout-s (default: the same). With --stop-after-round-trip a
# tool turn ends as soon as the round trip is done: hello.txt exists and the client has sent the model its next
# request (the tool's result); the small models tend to repeat a call that worked until the client gives up.
#
# --ci is the trimmed run of scripts/test: phases cold and tool, tool turns of at most 120 s stopped after the round
# trip. It fails when a client does not complete its cold turn (exit 0, the model's answer printed); the tool turn is
# reported only (whether the model calls a tool is the model's choice).
# plus the launcher's own behaviour: --no-serve refuses, a missing client names its install command, and a background
# `splash serve` is started (with progress and a log path) when none answers.
# Prints a table (turn ok, answer, TTFT cold/warm, tool file written) and "N passed, M failed".
#
# Usage: scripts/e2e/agents.sh [--no-build] [--model qwen2.5-coder-0.5b] [--clients "pi opencode hermes codex claude"]
#                              [--deadline-s 5400] [--turn-timeout-s 600] [--phases "cold tool warm restart"]
#                              [--tool-timeout-s N] [--stop-after-round-trip] [--ci]
# Needs root for `unshare -n`; otherwise it tries an unprivileged user namespace (`unshare -r -n`).
set -euo pipefail
cd "$(dirname "$0")/../.."
repo="$PWD"
model=qwen2.5-coder-0.5b
clients="pi opencode hermes codex claude"
deadline_s=5400
turn_timeout_s=600
phases="cold tool warm restart"
tool_timeout_s=""
stop_after_round_trip=0
build=1
inside=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --no-build) build=0 ;;
        --model) model="$2"; shift ;;
        --clients) clients="$2"; shift ;;
        --deadline-s) deadline_s="$2"; shift ;;
        --turn-timeout-s) turn_timeout_s="$2"; shift ;;
        --phases) phases="$2"; shift ;;
        --tool-timeout-s) tool_timeout_s="$2"; shift ;;
        --stop-after-round-trip) stop_after_round_trip=1 ;;
        --ci) phases="cold tool"; tool_timeout_s=120; stop_after_round_trip=1 ;;
        --inside) inside=1 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
    shift
done
tool_timeout_s="${tool_timeout_s:-$turn_timeout_s}"
export SPLASH_HOME="${SPLASH_HOME:-$HOME/.cache/splash}"

if [[ $inside == 0 ]]; then
    # Outside the namespace: install the clients (needs the registries) and build, then re-run inside.
    # shellcheck disable=SC2086
    bin="$(scripts/e2e/agents-install.sh $clients | tail -1)"
    [[ $build == 1 ]] && cargo build --release --locked -p splash-cli
    work="$(mktemp -d /tmp/splash-agents-e2e.XXXXXX)"
    echo "work dir: $work" >&2
    unshare=(unshare -n)
    [[ $EUID == 0 ]] || unshare=(unshare -r -n)
    round_trip=()
    [[ $stop_after_round_trip == 1 ]] && round_trip=(--stop-after-round-trip)
    AGENTS_BIN="$bin" AGENTS_WORK="$work" exec "${unshare[@]}" -- bash -c 'ip link set lo up && exec "$0" "$@"' "$0" \
        --inside --model "$model" --clients "$clients" --deadline-s "$deadline_s" --turn-timeout-s "$turn_timeout_s" \
        --tool-timeout-s "$tool_timeout_s" --phases "$phases" "${round_trip[@]}" </dev/null
fi

# ---- inside the network namespace ----
work="$AGENTS_WORK"
export PATH="$AGENTS_BIN:$PATH"
splash="$repo/target/release/splash"
results="$work/results.jsonl"
: >"$results"
if python3 -c 'import socket; socket.create_connection(("1.1.1.1", 443), timeout=3)' 2>/dev/null; then
    echo "the network namespace has a route out; refusing to run" >&2
    exit 1
fi
check() { # name ok(0/1) detail
    python3 -c 'import json,sys; print(json.dumps({"check": sys.argv[1], "ok": sys.argv[2] == "1", "detail": sys.argv[3]}))' \
        "$1" "$2" "$3" >>"$results"
    if [[ $2 == 1 ]]; then echo "ok    $1" >&2; else echo "FAIL  $1: $3" >&2; fi
}
key="e2e-agents-key"
server_port=18000
port=18001 # the launchers talk to the logging proxy, which forwards to the server
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# Launcher behaviour that needs no client run.
out="$("$splash" claude --no-serve --port 18009 2>&1 || true)"
[[ $out == *"no Splash server answers on http://127.0.0.1:18009 (--no-serve)"* ]] && ok=1 || ok=0
check "launcher: --no-serve refuses when no server answers" $ok "$out"
out="$(PATH=/usr/bin:/bin "$splash" codex --port 18009 2>&1 || true)"
[[ $out == "error: Codex CLI is not installed (no \`codex\` on PATH). Install it with: npm install -g @openai/codex" ]] \
    && ok=1 || ok=0
check "launcher: a missing client gives one line with its install command" $ok "$out"
# Background start: no server on 18002, so the launcher starts one and waits (dry run: the agent is not started).
t0=$SECONDS
SPLASH_API_KEY="$key" "$splash" opencode --port 18002 --pack "$model" --dry-run >"$work/bg.out" 2>"$work/bg.err" || true
bg_pid="$(grep -o 'in the background (pid [0-9]*' "$work/bg.err" | grep -o '[0-9]*$' || true)"
[[ -n $bg_pid ]] && kill "$bg_pid" 2>/dev/null || true
if grep -q 'starting `splash serve --model' "$work/bg.err" && grep -q "log $SPLASH_HOME/logs/serve-18002.log" "$work/bg.err" \
    && grep -q 'server ready' "$work/bg.err" && grep -q '^OPENCODE_CONFIG_CONTENT=' "$work/bg.out" \
    && ! grep -q "$key" "$work/bg.out" "$work/bg.err"; then ok=1; else ok=0; fi
check "launcher: starts splash serve in the background with progress and log path ($((SECONDS - t0)) s), key not shown" \
    $ok "$(cat "$work/bg.err")"

# The server under test, and the logging proxy in front of it.
source scripts/e2e/serve.sh
start_server() { # log file
    start_serve "$1" "$splash" --model "$model" --port $server_port --api-key "$key"
    pids+=($server_pid)
}
start_server "$work/serve.log"
AGENTS_PROXY_BODIES="$work/bodies" python3 scripts/e2e/agents_proxy.py $port $server_port "$work/requests.jsonl" &
pids+=($!)
sleep 0.5
export SPLASH_PORT=$port SPLASH_API_KEY="$key"

# Quiet, fail-fast switches for an offline run (none of them points a client at the server: the launchers do that).
export CLAUDE_CODE_MAX_RETRIES=1 OPENCODE_DISABLE_MODELS_FETCH=1 OPENCODE_DISABLE_AUTOUPDATE=1 \
    NPM_CONFIG_REGISTRY=http://127.0.0.1:9/ HERMES_DISABLE_LAZY_INSTALLS=1 TIRITH_ENABLED=false PI_OFFLINE=1 \
    PI_SKIP_VERSION_CHECK=1

hostile_home() { # a HOME whose user config would send each client elsewhere
    local h="$1"
    mkdir -p "$h/.claude" "$h/.codex" "$h/.config/opencode" "$h/.hermes" "$h/.pi/agent"
    echo '{"env":{"ANTHROPIC_BASE_URL":"http://127.0.0.1:9","ANTHROPIC_AUTH_TOKEN":"wrong","ANTHROPIC_MODEL":"claude-opus-4"}}' \
        >"$h/.claude/settings.json"
    printf 'model_provider = "openai"\nmodel = "gpt-5"\nmodel_context_window = 1000000\n' >"$h/.codex/config.toml"
    echo '{"model":"openai/gpt-5","provider":{"splash":{"options":{"baseURL":"http://127.0.0.1:9/v1"}}}}' \
        >"$h/.config/opencode/opencode.json"
    printf 'model:\n  provider: openrouter\n  default: some/model\n  api_mode: codex_responses\n' >"$h/.hermes/config.yaml"
    echo '{"providers":{"ollama":{"baseUrl":"http://127.0.0.1:11434/v1","api":"openai-completions","apiKey":"ollama","models":[{"id":"llama3.1:8b"}]}}}' \
        >"$h/.pi/agent/models.json"
}

run() { # client turn prompt -> runs the launcher in $work/<client>-<turn>, records timing
    local c="$1" turn="$2" prompt="$3" dir="$work/$1-$2" project="$work/$1-project" extra=() args=()
    mkdir -p "$dir" "$project"
    [[ $turn == tool ]] && rm -f "$project/hello.txt"
    case "$c" in
        claude) args=(-- -p "$prompt" --allowedTools Bash,Write,Edit,Read) ;;
        codex) args=(-- -c features.plugins=false exec --skip-git-repo-check --ephemeral -s workspace-write "$prompt") ;;
        opencode) args=(-- run "$prompt") ;;
        hermes) extra=(--allow-small-context); args=(-- -z "$prompt") ;;
        pi) args=(-- -p "$prompt" --no-session) ;;
    esac
    local t0 t1 rc=0 limit_s="$turn_timeout_s" stopped=0
    [[ $turn == tool ]] && limit_s="$tool_timeout_s"
    if ((SECONDS > deadline_s)); then
        python3 -c 'import json,sys; print(json.dumps({"run": sys.argv[1], "turn": sys.argv[2], "skipped": True}))' \
            "$c" "$turn" >>"$results"
        echo "$c $turn: skipped (past the ${deadline_s} s deadline)" >&2
        return
    fi
    t0="$(date +%s.%N)"
    # `timeout` runs the client in its own process group and passes a TERM on to all of it.
    (cd "$project" && HOME="$work/home-$c" exec timeout "$limit_s" "$splash" "$c" "${extra[@]}" "${args[@]}" </dev/null \
        >"$dir/stdout" 2>"$dir/stderr") &
    local client=$! hello
    if [[ $turn == tool && $stop_after_round_trip == 1 ]]; then
        # The round trip is done once a request that carries a tool's result back to the model (any of the three
        # protocols) arrived after hello.txt was written.
        while kill -0 "$client" 2>/dev/null; do
            hello="$(find "$project" "$work/home-$c" -name hello.txt 2>/dev/null | head -1)"
            if [[ -n $hello ]] && find "$work/bodies" -type f -newer "$hello" -print0 2>/dev/null | xargs -0 -r \
                grep -l -E '"role" *: *"tool"|"type" *: *"(tool_result|function_call_output)"' | grep -q .; then
                kill -TERM "$client" 2>/dev/null && stopped=1
                break
            fi
            sleep 0.5
        done
    fi
    wait "$client" || rc=$?
    t1="$(date +%s.%N)"
    [[ $turn == tool && -e "$project/hello.txt" ]] && cp "$project/hello.txt" "$dir/hello.txt"
    python3 -c 'import json,sys; a=sys.argv; print(json.dumps({"run": a[1], "turn": a[2], "rc": int(a[3]), "t0": float(a[4]), "t1": float(a[5]), "dir": a[6], "stopped": a[7] == "1"}))' \
        "$c" "$turn" "$rc" "$t0" "$t1" "$dir" "$stopped" >>"$results"
    printf '%-9s %-5s rc=%-3s %6.1f s  %s%s\n' "$c" "$turn" "$rc" "$(awk "BEGIN {print $t1 - $t0}")" \
        "$( ((stopped)) && echo '(stopped after the round trip) ')" "$(tr '\n' ' ' <"$dir/stdout" | cut -c1-100)" >&2
}

for c in $clients; do
    hostile_home "$work/home-$c"
    if [[ $c == hermes ]]; then
        out="$(HOME="$work/home-$c" "$splash" hermes -- -z hi 2>&1 || true)"
        [[ $out == *"requires a context of at least 64000 tokens"*"has 32768 tokens"* ]] && ok=1 || ok=0
        check "hermes: a 32768-token server is refused plainly without --allow-small-context" $ok "$out"
    fi
done
SECONDS=0
has_phase() { [[ " $phases " == *" $1 "* ]]; }
if has_phase cold; then
    for c in $clients; do run "$c" cold "What is the capital of France? Answer in one short sentence."; done
fi
if has_phase tool; then
    for c in $clients; do run "$c" tool "Create a file named hello.txt containing the word hi, using your tools."; done
fi
if has_phase warm; then
    for c in $clients; do run "$c" warm "What is 2+3? Answer with just the number."; done
fi
if has_phase restart; then
    # A restarted server has an empty memory cache: a fast first token now comes from the prefix cache on disk.
    kill "$server_pid" && wait "$server_pid" 2>/dev/null || true
    start_server "$work/serve-restarted.log"
    for c in $clients; do run "$c" restart "What is 3+4? Answer with just the number."; done
fi
if [[ " $clients " == *" pi "* ]]; then
    python3 - "$work/home-pi/.pi/agent/models.json" "$port" >/dev/null 2>&1 <<'PY' && ok=1 || ok=0
import json, sys
m = json.load(open(sys.argv[1]))["providers"]
assert m["ollama"]["models"] == [{"id": "llama3.1:8b"}]
assert m[f"splash-{sys.argv[2]}"]["baseUrl"] == f"http://127.0.0.1:{sys.argv[2]}/v1"
PY
    check "pi: models.json keeps the user's providers and gains ours" $ok "$(cat "$work/home-pi/.pi/agent/models.json")"
fi
kill "${pids[@]}" 2>/dev/null || true
python3 scripts/e2e/agents_report.py "$work" "$model"
