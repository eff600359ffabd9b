#!/usr/bin/env bash
# The CUDA backend where the CUDA toolkit is installed: `make cuda` must build it, and its GPU tests run; each
# prints SKIP and passes when no device is present (tests/gpu_check.sh runs them on a GPU machine). Without
# nvcc this says so and checks only that qwenc names the missing backend when asked for it.
source "$(dirname "$0")/lib_cli.sh"
expect_error "--backend cuda without the backend" "cuda" $QWENC run -m models/tiny-flash -p hi -n 1 --backend cuda
if ! command -v "${NVCC:-nvcc}" >/dev/null; then
    echo "SKIP: nvcc is not installed: the CUDA backend is not compiled here (make cuda; tests/gpu_check.sh)"
    finish
    exit $?
fi
# the build of the CUDA backend is its own, whatever build runs this test: not the sanitizers' flags of `make asan`
# (its objects in build-cuda/ would break a later plain `make cuda`)
unset MAKEFLAGS MFLAGS CFLAGS LDFLAGS
if make -j"$(nproc)" cuda >"$tmp/build.log" 2>&1; then ok; else bad "make cuda: $(tail -n 20 "$tmp/build.log")"; fi
grep -E "warning" "$tmp/build.log" && bad "make cuda printed warnings" || ok
for t in build-cuda/tests/gpu/t_*; do
    case $t in *.o | *.d) continue ;; esac
    out=$("$t" 2>&1)
    rc=$?
    line=$(printf '%s\n' "$out" | tail -n 1)
    if [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -qE '^SKIP|^[0-9]+ passed, 0 failed$'; then ok; else bad "$t (exit $rc): $line"; fi
    printf '%s\n' "$out" | grep -m1 '^SKIP' || true
done
finish
