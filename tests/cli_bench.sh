#!/usr/bin/env bash
# End-to-end test of `qwenc bench` as a user runs it: on a tiny fixture, --json gives one object with the
# speeds, peak memory and the decode bound, all positive, and the settings echoed back; the table form
# names both tests; --profile accounts for every step, token and lm_head read (and with -d, the timed tokens
# alone); bad options fail with a message. No timing is asserted.
source "$(dirname "$0")/lib_cli.sh"

M=tests/fixtures/qwen4_exp
if $QWENC bench -m $M -p 16 -n 8 -r 1 -t 2 --json >"$tmp/out.json" 2>"$tmp/err"; then
    ok
    python3 - "$tmp/out.json" >"$tmp/check" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, "one line of output"
j = json.loads(lines[0])
for k in ["pp_tps", "tg_tps", "peak_rss_bytes", "bound_tg_tps", "read_bw_bytes_per_s", "decode_bytes_per_token",
          "weight_bytes", "tg_fraction_of_bound"]:
    v = j.get(k)
    print(("ok " if isinstance(v, (int, float)) and v > 0 else "bad ") + k + " = " + repr(v))
settings = {"n_prompt": 16, "n_gen": 8, "reps": 1, "n_threads": 2, "arch": "qwen4_exp"}
for k, want in settings.items():
    print(("ok " if j.get(k) == want else "bad ") + k + " = " + repr(j.get(k)))
print(("ok " if j.get("decode_bytes_per_token", 0) <= j.get("weight_bytes", 0) else "bad ") + "decode reads at most the weights")
print(("ok " if isinstance(j.get("kernels"), str) and j["kernels"] else "bad ") + "kernels")
PY
    while read -r status what; do
        if [ "$status" = ok ]; then ok; else bad "bench --json: $what"; fi
    done <"$tmp/check"
    [ -s "$tmp/check" ] || bad "bench --json: output is not the expected JSON: $(head -c 300 "$tmp/out.json")"
else
    bad "bench --json failed: $(cat "$tmp/err")"
fi

# the table: both tests, the bound line; --kernels ref and -p 0 (generation only)
if out=$($QWENC bench -m $M -p 8 -n 4 -r 2 -t 1 2>&1); then
    for want in "pp8" "tg4" "peak RSS" "decode bound"; do
        case "$out" in *"$want"*) ok ;; *) bad "bench table lacks '$want'";; esac
    done
else
    bad "bench table failed: $out"
fi
if out=$($QWENC bench -m $M -p 0 -n 4 -r 1 --kernels ref --json 2>&1); then
    case "$out" in *'"pp_tps":null'*'"kernels":"ref"'*|*'"kernels":"ref"'*'"pp_tps":null'*) ok ;;
        *) bad "bench -p 0 --kernels ref: $out";; esac
else
    bad "bench -p 0 --kernels ref failed: $out"
fi

# --profile: per test, the ops and weight tensors of the timed runs (tokens = n * reps), "between ops" once per
# step, the lm_head read once per step; in the table form, one profile table per test
if $QWENC bench -m $M -p 16 -n 8 -r 2 -t 2 --json --profile >"$tmp/prof.json" 2>"$tmp/err"; then
    python3 - "$tmp/prof.json" >"$tmp/check" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read())
p = j.get("profile", {})
for test, tokens, steps in (("pp", 32, 2), ("tg", 16, 16)):
    t = p.get(test, {})
    ops = {o["name"]: o for o in t.get("ops", [])}
    print(("ok " if t.get("tokens") == tokens and t.get("steps") == steps else "bad ") + f"{test} totals {t.get('tokens')} {t.get('steps')}")
    b = ops.get("between ops (the model's own code)", {})
    print(("ok " if b.get("calls") == steps else "bad ") + f"{test} between ops {b}")
    lm = [o for n, o in ops.items() if n.startswith("matmul ") and n.endswith("lm_head.weight")]
    print(("ok " if len(lm) == 1 and lm[0]["calls"] == steps and lm[0]["bytes"] > 0 else "bad ") + f"{test} lm_head {lm}")
    total = sum(o["seconds"] for o in ops.values())
    print(("ok " if abs(total - t.get("seconds", -1)) <= 1e-6 * t.get("seconds", 1) + 1e-9 else "bad ") + f"{test} seconds add up")
PY
    while read -r status what; do
        if [ "$status" = ok ]; then ok; else bad "bench --profile --json: $what"; fi
    done <"$tmp/check"
    [ -s "$tmp/check" ] || bad "bench --profile --json: no output checked"
else
    bad "bench --profile --json failed: $(cat "$tmp/err")"
fi
if out=$($QWENC bench -m $M -p 8 -n 4 -r 1 -t 1 --profile 2>&1); then
    for want in "profile of pp8: 8 tokens in 1 step," "profile of tg4: 4 tokens in 4 steps" "delta_rule" "lm_head.weight"; do
        case "$out" in *"$want"*) ok ;; *) bad "bench --profile table lacks '$want'";; esac
    done
else
    bad "bench --profile failed: $out"
fi
# with -np, the batched steps' ops (every session's, through the first session's profile): n * np * reps tokens
# in n * reps steps, the lm_head read once a step
if out=$($QWENC bench -m $M -p 0 -n 3 -np 2 -r 2 -t 1 --profile 2>&1); then
    for want in "profile of tg3x2: 12 tokens in 6 steps" "delta_rule"; do
        case "$out" in *"$want"*) ok ;; *) bad "bench -np 2 --profile table lacks '$want'";; esac
    done
    lm=$(echo "$out" | sed -n '/profile of tg3x2/,$p' | grep "lm_head.weight" | awk '{print $3}')
    [ "$lm" = 0.50 ] && ok || bad "bench -np 2 --profile: lm_head calls a token '$lm', not 0.50"
else
    bad "bench -np 2 --profile failed: $out"
fi

# -np: the tg tests of sessions decoding together, a row and a JSON line each, with its session count; no bound
# fraction for a batch (the bound is one session's)
if $QWENC bench -m $M -p 0 -n 6 -np 1,3 -r 1 -t 1 --json >"$tmp/np.json" 2>"$tmp/err"; then
    python3 - "$tmp/np.json" >"$tmp/check" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ok = [r["test"] for r in rows] == ["tg6", "tg6x3"] and [r["n_parallel"] for r in rows] == [1, 3]
ok = ok and all(r["tg_tps"] > 0 for r in rows) and rows[0]["tg_fraction_of_bound"] is not None
ok = ok and rows[1]["tg_fraction_of_bound"] is None
print("ok" if ok else "bad %s" % rows)
PY
    [ "$(cat "$tmp/check")" = ok ] && ok || bad "bench -np 1,3 --json: $(cat "$tmp/check")"
else
    bad "bench -np 1,3 failed: $(cat "$tmp/err")"
fi

# --draft: each tg test also in draft steps (tgNdK), its own row with the steps' rate
if out=$($QWENC bench -m $M -p 0 -n 6 --draft 2 -r 1 -t 1 2>&1); then
    case "$out" in *"tg6d2"*) ok ;; *) bad "bench --draft 2: no tg6d2 row: $out";; esac
else
    bad "bench --draft 2 failed: $out"
fi
expect_error "bench --draft 16" "--draft must be at most 15" $QWENC bench -m $M -p 0 -n 4 --draft 16

# -d: every test after that much context, fed untimed before each run: the rows named with it (llama-bench's
# @dN), the JSON's n_depth, and a profile of the timed tokens alone (the last run's: the context is not counted)
if out=$($QWENC bench -m $M -p 8 -n 4 -d 20 -r 2 -t 1 --profile 2>&1); then
    for want in "pp8@d20 " "tg4@d20 " "profile of pp8@d20: 8 tokens in 1 step," \
        "profile of tg4@d20: 4 tokens in 4 steps"; do
        case "$out" in *"$want"*) ok ;; *) bad "bench -d 20 --profile lacks '$want'";; esac
    done
else
    bad "bench -d 20 failed: $out"
fi
if out=$($QWENC bench -m $M -p 0 -n 3 -np 2 -d 10 -r 2 -t 1 --profile 2>&1); then
    case "$out" in
        *"profile of tg3x2@d10: 6 tokens in 3 steps"*) ok ;;
        *) bad "bench -np 2 -d 10 --profile: $out" ;;
    esac
else
    bad "bench -np 2 -d 10 failed: $out"
fi
if out=$($QWENC bench -m $M -p 0 -n 4 -d 12 -r 1 -t 1 --json 2>&1); then
    case "$out" in *'"n_depth":12'*) ok ;; *) bad "bench -d 12 --json: no n_depth 12: $out";; esac
else
    bad "bench -d 12 --json failed: $out"
fi
expect_error "bad -d" "-d expects an integer >= 0" $QWENC bench -m $M -d -5

# tests/ab.sh: switches against each other in one binary, a row per set and test, the first set the baseline
if out=$(QWENC=$QWENC ROUNDS=1 bash tests/ab.sh - 'QWENC_AB_UNUSED=1' -- -m $M -p 8 -n 4 -t 1 2>&1); then
    rows=$(printf '%s\n' "$out" | grep -cE '^(-|QWENC_AB_UNUSED=1) +(pp8|tg4) ')
    base=$(printf '%s\n' "$out" | grep -cE '^- +(pp8|tg4) .* 1\.000x$')
    if [ "$rows" = 4 ] && [ "$base" = 2 ]; then ok; else bad "ab.sh: not a row per set and test: $out"; fi
else
    bad "ab.sh failed: $out"
fi
expect_error "ab.sh: a set that is not assignments" "is not a NAME=VALUE assignment" \
    env QWENC=$QWENC bash tests/ab.sh nonsense -- -m $M -p 8 -n 0
expect_error "ab.sh: a failing bench" "failed" env QWENC=$QWENC bash tests/ab.sh - -- -m $M -p many

# bad input: a message and exit 1
expect_error "bad -np" "-np" $QWENC bench -m $M -np 0
expect_error "bad -p" "-p expects an integer >= 0" $QWENC bench -m $M -p many
expect_error "bad -t" "expects an integer >= 0" $QWENC bench -m $M -t -2
expect_error "unknown kernels" 'kernels "avx9" are not available' $QWENC bench -m $M --kernels avx9 -p 4 -n 0
expect_error "nothing to run" "nothing to run" $QWENC bench -m $M -p 0 -n 0

finish
