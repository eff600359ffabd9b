#!/usr/bin/env bash
# cli_fuzz.sh - the fuzz targets of tests/fuzz (docs/TESTING.md, Fuzzing), in two steps:
#   1. every target's seeds (tests/fuzz/corpus/<target>) and regression inputs (tests/fuzz/regress/<target>)
#      replayed through BUILD/fuzz/replay_<target>, built here (`make fuzz-replay`) with the project's compiler
#      (and under `make asan` with the sanitizers), so they run wherever the suite runs;
#   2. where clang has libFuzzer: `make fuzz`, then each libFuzzer program for QWENC_FUZZ_SECONDS (default 12)
#      seconds, two at a time, from the seeds (the regression inputs were replayed above; some take seconds), with
#      ASan + UBSan, a 2 GiB RSS limit, a 256 MiB limit on any one allocation and 25 s per input (instrumented
#      byte loops run ~30x slower than -O2); any finding fails the test and its input is kept under
#      FUZZ_BUILD/findings/. New corpus inputs go to a scratch directory, never into the repository.
#      Skipped under `make asan` (the same run happens in `make test`) and when QWENC_FUZZ_SECONDS=0.
source "$(dirname "$0")/lib_cli.sh"
FUZZ_BUILD=${FUZZ_BUILD:-build-fuzz}
FUZZ_CC=${FUZZ_CC:-clang}
secs=${QWENC_FUZZ_SECONDS:-12}
targets=$(for f in tests/fuzz/fuzz_*.c; do t=${f#tests/fuzz/fuzz_}; echo "${t%.c}"; done)

inputs_of() {
    local t=$1
    echo "tests/fuzz/corpus/$t"
    [ -d "tests/fuzz/regress/$t" ] && echo "tests/fuzz/regress/$t"
}

# a make of its own (the suite's make is idle while the tests run), with the flags of make asan when under it
submake() {
    env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS make -s -j2 BUILD="$BUILD" ${CFLAGS+CFLAGS="$CFLAGS"} \
        ${LDFLAGS+LDFLAGS="$LDFLAGS"} "$@"
}

# 1. replay
if ! submake fuzz-replay >"$tmp/make_replay.log" 2>&1; then
    bad "make fuzz-replay failed:"
    tail -n 30 "$tmp/make_replay.log"
fi
for t in $targets; do
    bin=$BUILD/fuzz/replay_$t
    if [ ! -x "$bin" ]; then bad "$t: $bin is missing (make fuzz-replay builds it)"; continue; fi
    # shellcheck disable=SC2046
    if "$bin" $(inputs_of "$t") >"$tmp/replay_$t.log" 2>&1; then
        ok
    else
        bad "$t: replaying its seeds and regression inputs failed:"
        tail -n 25 "$tmp/replay_$t.log"
    fi
done
echo "fuzz: replayed $(cat "$tmp"/replay_*.log 2>/dev/null | grep -c '^replay: ') seed and regression inputs of" \
     "$(echo $targets | wc -w) targets"

# 2. libFuzzer
if [ "$BUILD" = build-asan ]; then
    echo "fuzz: SKIP the libFuzzer runs under make asan (make test runs them)"
    finish
    exit
fi
if [ "$secs" = 0 ]; then
    echo "fuzz: SKIP the libFuzzer runs (QWENC_FUZZ_SECONDS=0)"
    finish
    exit
fi
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
    >"$tmp/probe.c"
if ! command -v "$FUZZ_CC" >/dev/null ||
   ! "$FUZZ_CC" -fsanitize=fuzzer,address,undefined "$tmp/probe.c" -o "$tmp/probe" >/dev/null 2>&1; then
    echo "fuzz: SKIP the libFuzzer runs: $FUZZ_CC with libFuzzer is not installed (Debian/Ubuntu: sudo apt-get install" \
         "clang libclang-rt-dev, or libclang-rt-N-dev for clang-N); the seeds and regression inputs were replayed"
    finish
    exit
fi
if ! env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS make -s -j2 FUZZ_CC="$FUZZ_CC" FUZZ_BUILD="$FUZZ_BUILD" fuzz \
        >"$tmp/make.log" 2>&1; then
    bad "make fuzz failed:"
    tail -n 30 "$tmp/make.log"
    finish
    exit
fi

run_target() {
    local t=$1
    local d=$tmp/fz_$t
    mkdir -p "$d/corpus"
    # shellcheck disable=SC2046
    "$FUZZ_BUILD/fuzz_$t" -max_total_time="$secs" -rss_limit_mb=2048 -malloc_limit_mb=256 -timeout=25 \
        -artifact_prefix="$d/" -print_final_stats=1 "$d/corpus" "tests/fuzz/corpus/$t" >"$d/log" 2>&1
    echo $? >"$d/rc"
}

set -- $targets
while [ $# -gt 0 ]; do
    run_target "$1" &
    if [ $# -gt 1 ]; then run_target "$2" & fi
    wait
    shift; [ $# -gt 0 ] && shift
done

for t in $targets; do
    d=$tmp/fz_$t
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$d/log" | tail -n 1 | grep -o '[0-9]*$')
    if [ "$(cat "$d/rc")" = 0 ]; then
        ok
        echo "fuzz: $t: ${runs:-?} inputs in ${secs} s, no finding"
    else
        mkdir -p "$FUZZ_BUILD/findings/$t"
        cp "$d"/crash-* "$d"/leak-* "$d"/timeout-* "$d"/oom-* "$FUZZ_BUILD/findings/$t/" 2>/dev/null
        bad "$t: libFuzzer found a problem (input kept in $FUZZ_BUILD/findings/$t/; once fixed, add it to" \
            "tests/fuzz/regress/$t/):"
        grep -E -m 12 'ERROR|runtime error|fuzz check failed|SUMMARY|^    #[0-9] ' "$d/log"
    fi
done
finish
