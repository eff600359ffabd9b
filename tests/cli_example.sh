#!/usr/bin/env bash
# The library example of the README (examples/simple.c, built by make test against include/qwenc.h alone):
# its greedy text is the text `qwenc run --temp 0` gives for the same prompt, and a bad model path is an
# error naming the path, with a non-zero exit.
source "$(dirname "$0")/lib_cli.sh"
EX=$BUILD/examples/simple
for p in "And it came to pass" "In the beginning"; do
    "$EX" models/tiny-flash "$p" 40 >"$tmp/ex.txt" 2>"$tmp/ex.err"
    rc=$?
    $QWENC run -m models/tiny-flash -p "$p" -n 40 --temp 0 >"$tmp/run.txt" 2>/dev/null
    if [ $rc -eq 0 ] && [ -s "$tmp/ex.txt" ] && cmp -s "$tmp/ex.txt" "$tmp/run.txt"; then ok
    else bad "example on \"$p\" (exit $rc): '$(head -c 200 "$tmp/ex.txt")' vs run: '$(head -c 200 "$tmp/run.txt")'"; fi
    grep -q "40 generated" "$tmp/ex.err" && ok || bad "example stats: $(cat "$tmp/ex.err")"
done
expect_error "example, missing model" "$tmp/no-such-model" "$EX" "$tmp/no-such-model" "hi"
finish
