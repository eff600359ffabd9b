#!/usr/bin/env bash
# The AArch64 kernels (neon.c, neon_q.c) checked from an x86 machine: cross-build the kernel tests and the
# model fixtures' tests (the whole forward, GGUF and load-time quantization through those kernels) into
# build-arm/ and run them under qemu-user on two emulated CPUs, one with the dot-product instructions
# (-cpu max: the neon variant takes its sdot integer tiles) and one without (-cpu cortex-a53: the smull
# tiles), so both paths of neon_q.c and the scalar variant run against the reference. Not part of
# `make test` (emulation is slow). Without the cross tools it says what to install and exits 0, skipped.
# Usage: bash tests/arm_check.sh [TEST ...]   (default: t_qkernels t_kernels t_model t_gguf_models t_load_quant)
set -u
cd "$(dirname "$0")/.."

CC=${ARM_CC:-aarch64-linux-gnu-gcc}
BUILD=${ARM_BUILD:-build-arm}
# The loader and libc must be one build: the arm64 libraries the tests link pull in libc6:arm64, whose
# /lib/ld-linux-aarch64.so.1 is used (-L /). The cross toolchain's own loader in /usr/aarch64-linux-gnu
# with that libc.so.6 of another build hangs in pthread_create.
SYSROOT=/
[ -e /lib/ld-linux-aarch64.so.1 ] || SYSROOT=/usr/aarch64-linux-gnu
QEMU=$(command -v qemu-aarch64 || command -v qemu-aarch64-static || true)
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(t_qkernels t_kernels t_model t_gguf_models t_load_quant)

missing=""
command -v "$CC" >/dev/null || missing="$missing gcc-aarch64-linux-gnu"
[ -n "$QEMU" ] || missing="$missing qemu-user"
for lib in libcjson:libcjson-dev libpcre2-8:libpcre2-dev libutf8proc:libutf8proc-dev; do
    [ -e "/usr/lib/aarch64-linux-gnu/${lib%%:*}.so" ] || missing="$missing ${lib#*:}:arm64"
done
if [ -n "$missing" ]; then
    echo "arm_check: skipped, missing:$missing"
    echo "  install: dpkg --add-architecture arm64 && apt-get update && apt-get install$missing"
    exit 0
fi

echo "arm_check: building ${tests[*]} with $CC into $BUILD/"
targets=()
for t in "${tests[@]}"; do targets+=("$BUILD/tests/$t"); done
if ! make -s CC="$CC" BUILD="$BUILD" "${targets[@]}"; then
    echo "arm_check: the cross build failed"
    echo "0 passed, 1 failed"
    exit 1
fi

total_pass=0; total_fail=0
for cpu in max cortex-a53; do
    for t in "${tests[@]}"; do
        echo "== $t on qemu -cpu $cpu"
        out=$("$QEMU" -cpu "$cpu" -L "$SYSROOT" "$BUILD/tests/$t" 2>&1); rc=$?
        printf '%s\n' "$out"
        line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
        if [ -z "$line" ]; then
            echo "ERROR: $t on $cpu ended (exit $rc) without a summary line"; total_fail=$((total_fail + 1)); continue
        fi
        total_pass=$((total_pass + $(echo "$line" | cut -d' ' -f1)))
        total_fail=$((total_fail + $(echo "$line" | cut -d' ' -f3)))
        [ "$rc" -eq 0 ] || [ "$(echo "$line" | cut -d' ' -f3)" -ne 0 ] || { echo "ERROR: exit $rc"; total_fail=$((total_fail + 1)); }
    done
done
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
