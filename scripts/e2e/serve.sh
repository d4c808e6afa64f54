# Sourced by the e2e scripts: start `splash serve` in the background and wait until it prints Ready.
#
#   start_serve LOG SPLASH_BINARY SERVE_ARGS...   sets $server_pid; exits (printing the log) if the server dies or
#                                                 is not ready within 120 s.
start_serve() {
    local log="$1" bin="$2"
    shift 2
    "$bin" serve "$@" >"$log" 2>&1 &
    server_pid=$!
    for _ in $(seq 1 600); do
        grep -q '^Ready' "$log" && return 0
        kill -0 "$server_pid" 2>/dev/null || { cat "$log"; echo "splash serve exited before it was ready" >&2; exit 1; }
        sleep 0.2
    done
    cat "$log"
    echo "splash serve was not ready after 120 s" >&2
    exit 1
}
