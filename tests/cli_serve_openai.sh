#!/usr/bin/env bash
# The official `openai` npm client against `qwenc serve` (tests/serve_openai.mjs): a server on the bundled model
# and one on the scripted tool-calling model (tests/serve_model.py). The client is installed from the npm
# registry into $BUILD/npm-openai the first time, then reused; without node, npm or the network this says SKIP.
source "$(dirname "$0")/lib_cli.sh"
source "$(dirname "$0")/lib_serve.sh"
PKG=openai@6.30.1
dir=$BUILD/npm-openai
skip() {
    echo "SKIP the openai client tests: $1"
    finish
    exit 0
}
command -v node >/dev/null && command -v npm >/dev/null || skip "node and npm are not installed (apt-get install npm)"
if [ "$(node -e "try { console.log(require('./$dir/node_modules/openai/package.json').version) } catch (e) {}" 2>/dev/null)" != "${PKG#openai@}" ]; then
    echo "tests: installing $PKG from the npm registry into $dir" >&2
    mkdir -p "$dir"
    timeout 120 npm install --prefix "$dir" --no-audit --no-fund --silent "$PKG" >"$tmp/npm.log" 2>&1 ||
        skip "npm could not install $PKG ($(grep -m 1 . "$tmp/npm.log" | cut -c1-160))"
fi

python3 tests/serve_model.py "$tmp/xml" xml || bad "serve_model.py"
start_server plain -m models/tiny-flash -np 2 || { finish; exit 1; }
QWENC_URL=$URL; PLAIN_PID=$SPID
start_server tools -m "$tmp/xml" -np 2 || { finish; exit 1; }
TOOLS_URL=$URL
WANT_GREEDY=$($QWENC run -m models/tiny-flash --chat -p "Tell me about the city by the sea." -n 24 --temp 0 \
    --no-display-prompt 2>/dev/null)
OPENAI_DIR=$PWD/$dir QWENC_URL=$QWENC_URL TOOLS_URL=$TOOLS_URL WANT_GREEDY=$WANT_GREEDY \
    EXPECTED=$(python3 tests/serve_model.py --expected) timeout 120 node tests/serve_openai.mjs >"$tmp/node.out" 2>&1
while read -r line; do
    case "$line" in
    PASS*) ok ;;
    FAIL*) bad "openai client: ${line#FAIL }" ;;
    esac
done <"$tmp/node.out"
[ "$((pass + fail))" -ge 8 ] && ok || bad "the client ran $((pass + fail)) checks: $(tail -c 600 "$tmp/node.out")"
stop_server && ok || bad "tools server exit"
SPID=$PLAIN_PID
stop_server && ok || bad "plain server exit"
finish
