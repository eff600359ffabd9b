# lib_cli.sh - sourced by every tests/cli_*.sh: the binaries under test, pass/fail counting, a scratch
# directory removed on exit, and expect_error. Each script ends with `finish`.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
QWENC=${QWENC:-build/qwenc}
BUILD=${BUILD:-build}
T_MODEL=$BUILD/tests/t_model
pass=0; fail=0
ok()  { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# expect_error NAME PATTERN CMD...: CMD must exit 1 (not crash) and print PATTERN on stderr
expect_error() {
    local name=$1 pat=$2; shift 2
    "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
    if [ "$rc" -ne 1 ]; then bad "$name: exit code $rc, expected 1 ($(head -c 300 "$tmp/err"))"; return; fi
    if grep -qF -- "$pat" "$tmp/err"; then ok; else bad "$name: stderr lacks '$pat': $(head -c 400 "$tmp/err")"; fi
}

# the closing line tests/run.sh reads, and the exit status
finish() {
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
