#!/usr/bin/env bash
# Run every test program given as an argument and every tests/cli_*.sh script, then print the total.
# Each one prints lines and ends with "N passed, M failed"; the sum is printed as the last line.
set -u
cd "$(dirname "$0")/.."
total_pass=0; total_fail=0; broken=0
run_one() {
    local out rc line
    out=$("$@" 2>&1); rc=$?
    printf '%s\n' "$out"
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
    if [ -z "$line" ]; then
        echo "ERROR: $* ended (exit $rc) without a summary line"; broken=$((broken + 1)); return
    fi
    total_pass=$((total_pass + $(echo "$line" | cut -d' ' -f1)))
    total_fail=$((total_fail + $(echo "$line" | cut -d' ' -f3)))
    if [ "$rc" -ne 0 ] && [ "$(echo "$line" | cut -d' ' -f3)" -eq 0 ]; then
        echo "ERROR: $* exited $rc"; broken=$((broken + 1))
    fi
}
for t in "$@"; do
    echo "== $t"
    run_one "$t"
done
for s in tests/cli_*.sh; do
    [ -f "$s" ] || continue
    echo "== $s"
    run_one bash "$s"
done
total_fail=$((total_fail + broken))
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
