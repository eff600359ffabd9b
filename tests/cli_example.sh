#!/usr/bin/env bash
# The library example (examples/simple.c, built by make test against include/qwenc.h alone): README.md shows
# it verbatim, its greedy text is the text `qwenc run --temp 0` gives for the same prompt, and a bad model
# path is an error naming the path, with a non-zero exit.
source "$(dirname "$0")/lib_cli.sh"
EX=$BUILD/examples/simple
# the README's C block is the example from its first #include on
python3 - README.md examples/simple.c >"$tmp/readme_check" <<'PY'
import sys
readme, src = open(sys.argv[1]).read(), open(sys.argv[2]).read()
blocks = readme.split("```c\n")[1:]
block = blocks[0].split("```")[0] if blocks else ""
print("same" if block and block == src[src.index("\n#include") + 1:] else "differ")
PY
[ "$(cat "$tmp/readme_check")" = same ] && ok || bad "README.md's C block is not examples/simple.c from its first #include"
for p in "And it came to pass" "In the beginning"; do
    "$EX" models/tiny-flash "$p" 40 >"$tmp/ex.txt" 2>"$tmp/ex.err"
    rc=$?
    $QWENC run -m models/tiny-flash -p "$p" -n 40 --temp 0 --no-display-prompt >"$tmp/run.txt" 2>/dev/null
    if [ $rc -eq 0 ] && [ -s "$tmp/ex.txt" ] && cmp -s "$tmp/ex.txt" "$tmp/run.txt"; then ok
    else bad "example on \"$p\" (exit $rc): '$(head -c 200 "$tmp/ex.txt")' vs run: '$(head -c 200 "$tmp/run.txt")'"; fi
done
expect_error "example, missing model" "$tmp/no-such-model" "$EX" "$tmp/no-such-model" "hi"
finish
