#!/usr/bin/env bash
# Switches measured against each other in one binary and one run: `qwenc bench` with each set of environment
# assignments in turn, ROUNDS times over (interleaved, so that a drift of the machine's clocks falls on every set
# alike), then per set and bench test the tok/s of each round, their mean, and the mean against the first set's.
# The CUDA backend's run-time switches (QWENC_CUDA_*: docs/BENCH.md names each beside what it measured) and the
# CPU's are read from the environment, so one build answers "is this path faster" without a second build.
#
#   bash tests/ab.sh SET [SET ...] -- [qwenc bench options]
#   SET: NAME=VALUE assignments in one word, separated by spaces ('QWENC_CUDA_ROWS=0 QWENC_CUDA_PDL=0'), or -
#   for none (the defaults). ROUNDS=2; QWENC: the binary (build/qwenc); TIMEOUT: seconds a bench (300).
#
#   bash tests/ab.sh QWENC_CUDA_MOE_X_IN_PLACE=0 - -- --backend cuda --synth flash-next --type q4_k -p 0 -n 32
set -u
cd "$(dirname "$0")/.." || exit 1
Q=${QWENC:-build/qwenc}
sets=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
    sets+=("$1")
    shift
done
if [ $# -eq 0 ] || [ ${#sets[@]} -eq 0 ]; then
    echo "usage: bash tests/ab.sh SET [SET ...] -- [qwenc bench options]   (SET: 'NAME=VALUE ...' or -)" >&2
    exit 1
fi
shift
for s in "${sets[@]}"; do
    [ "$s" = - ] && continue
    for a in $s; do
        case $a in
            [A-Za-z_]*=*) ;;
            *) echo "ab.sh: '$a' in set '$s' is not a NAME=VALUE assignment" >&2; exit 1 ;;
        esac
    done
done
[ -x "$Q" ] || { echo "ab.sh: $Q is not there (make, or QWENC=build-cuda/qwenc after make cuda)" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
declare -A val
tests=()
for ((r = 1; r <= ${ROUNDS:-2}; r++)); do
    for i in "${!sets[@]}"; do
        s=${sets[$i]}
        env_args=()
        [ "$s" != - ] && read -r -a env_args <<<"$s"
        if ! env "${env_args[@]}" timeout "${TIMEOUT:-300}" "$Q" bench "$@" -r 1 >"$out" 2>&1; then
            echo "ab.sh: bench with '$s' failed:" >&2
            tail -n 5 "$out" >&2
            exit 1
        fi
        # the table's rows: | model | arch | size | backend | threads | test | t/s |
        while IFS='|' read -r _ _ _ _ _ _ test ts _; do
            test=$(echo "$test" | tr -d ' ')
            ts=$(echo "$ts" | awk '{print $1}')
            if [ -z "$test" ] || [ "$test" = test ] || [ "${test#-}" != "$test" ]; then continue; fi
            [ "$i" -eq 0 ] && [ "$r" -eq 1 ] && tests+=("$test")
            val[$i,$test]="${val[$i,$test]:-} $ts"
        done < <(grep '^|' "$out")
    done
done
[ ${#tests[@]} -gt 0 ] || { echo "ab.sh: bench printed no results" >&2; exit 1; }
printf '%-44s %-8s %s\n' "set" "test" "tok/s a round, mean, mean against the first set"
for t in "${tests[@]}"; do
    base=
    for i in "${!sets[@]}"; do
        v=${val[$i,$t]:-}
        mean=$(echo "$v" | awk '{s = 0; for (i = 1; i <= NF; i++) s += $i; if (NF) printf "%.2f", s / NF}')
        [ -z "$base" ] && base=$mean
        ratio=$(awk -v a="$mean" -v b="$base" 'BEGIN { if (b > 0) printf "%.3f", a / b }')
        printf '%-44s %-8s %s  mean %s  %sx\n' "${sets[$i]}" "$t" "$(echo "$v" | tr -s ' ' | sed 's/^ //')" "$mean" \
            "$ratio"
    done
done
