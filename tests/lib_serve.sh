# lib_serve.sh - sourced by tests/cli_serve*.sh after lib_cli.sh: start a server on a free loopback port and stop
# it, send requests with curl (each bounded in time), read JSON with python3. Without curl or python3 the
# scripts say SKIP and pass nothing.
if ! command -v curl >/dev/null || ! command -v python3 >/dev/null; then
    echo "SKIP $(basename "$0"): needs curl and python3 (bash tools/install-deps.sh test installs them)"
    finish
    exit 0
fi
SPIDS=""
trap 'for p in $SPIDS; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT

# start_server NAME ARGS...: `qwenc serve --port 0 ARGS` with its log in $tmp/NAME.log; waits until /health says
# ok; sets PORT, SPID and URL. 1 (and a failure) if it does not come up within 30 s.
start_server() {
    local name=$1; shift
    "$QWENC" serve --port 0 "$@" >"$tmp/$name.out" 2>"$tmp/$name.log" &
    SPID=$!
    SPIDS="$SPIDS $SPID"
    PORT=""
    for _ in $(seq 600); do
        [ -z "$PORT" ] && PORT=$(sed -n 's/^qwenc: listening on http:\/\/[^ ]*:\([0-9][0-9]*\) .*/\1/p' "$tmp/$name.log" | head -n 1)
        URL=http://127.0.0.1:$PORT
        if [ -n "$PORT" ] && [ "$(curl -s -m 5 -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ]; then return 0; fi
        kill -0 "$SPID" 2>/dev/null || break
        sleep 0.05
    done
    bad "server $name did not start: $(tail -n 3 "$tmp/$name.log")"
    return 1
}

# stop_server: SIGTERM and wait; 0 if it exited 0
stop_server() {
    kill -TERM "$SPID" 2>/dev/null
    wait "$SPID"
}

# post PATH JSON [OUT]: POST JSON to the server; the body goes to OUT (default $tmp/body); prints the status
post() {
    curl -s -m 60 -o "${3:-$tmp/body}" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary "$2" "$URL$1"
}

# get PATH [OUT]
get() { curl -s -m 30 -o "${2:-$tmp/body}" -w '%{http_code}' "$URL$1"; }

# jget FILE EXPR: a Python expression over j, the file's JSON (printed as JSON when not a string)
jget() {
    python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
v = eval(sys.argv[2])
print(v if isinstance(v, str) else json.dumps(v))' "$1" "$2" 2>&1
}

# sse FILE: a stream's events checked and summed up as JSON (tests/serve_sse.py)
sse() { python3 tests/serve_sse.py "$1"; }
