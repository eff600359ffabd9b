#!/usr/bin/env bash
# Speculative decoding (--draft) end to end on the bundled model: for drafts of 1 to 4 tokens and auto, from its
# MTP draft head and from prompt lookup, up to 2,000 generated tokens (the sampled run ends earlier) are byte for
# byte the text without drafting, greedy and sampled (the same seed), and the runs both accepted and rejected
# drafts (so the steps that keep everything and those that take tokens back both ran);
# chat with drafts answers as chat without. The exactness of taking tokens back on every architecture is
# t_session's (test_drafts).
source "$(dirname "$0")/lib_cli.sh"
M=models/tiny-flash
P="And it came to pass in those days, that the king of Israel said unto the king of Judah,"
gen() { # OUT DRAFT ARGS...: run with --draft DRAFT, text to OUT, statistics to OUT.err
    local out=$1 d=$2; shift 2
    $QWENC run -m $M -p "$P" -n 2000 -c 2100 -t 2 --no-display-prompt --draft "$d" "$@" >"$out" 2>"$out.err"
}
for mode in greedy sampled; do
    args=(--temp 0)
    [ $mode = sampled ] && args=(--temp 0.8 --top-k 40 -s 1234)
    gen "$tmp/$mode.0" 0 "${args[@]}" || bad "$mode without drafts: $(tail -n 2 "$tmp/$mode.0.err")"
    words=$(wc -w <"$tmp/$mode.0")
    n0=$(sed -n 's/.*generated \([0-9]*\) tokens.*/\1/p' "$tmp/$mode.0.err")
    [ "$words" -gt 500 ] && ok || bad "$mode: only $words words of text"
    for src in head lookup; do
        for d in 1 2 3 4 auto; do
            f="$tmp/$mode.$src.$d"
            if ! gen "$f" $d --draft-src $src "${args[@]}"; then
                bad "$mode --draft $d --draft-src $src: $(tail -n 2 "$f.err")"
                continue
            fi
            cmp -s "$tmp/$mode.0" "$f" && ok || bad "$mode --draft $d --draft-src $src: the text differs from the text without drafts"
            line=$(grep '^qwenc: draft:' "$f.err")
            drafted=$(sed -n 's/.*drafted \([0-9]*\), accepted.*/\1/p' <<<"$line")
            accepted=$(sed -n 's/.*accepted \([0-9]*\) (.*/\1/p' <<<"$line")
            generated=$(sed -n 's/.* steps for \([0-9]*\) tokens.*/\1/p' <<<"$line")
            [ -n "$drafted" ] && [ "$accepted" -gt 0 ] && [ "$accepted" -lt "$drafted" ] && [ "$generated" = "$n0" ] && ok \
                || bad "$mode --draft $d --draft-src $src: drafts not both accepted and rejected: $line"
        done
    done
done
echo "  head:   $(grep '^qwenc: draft:' "$tmp/greedy.head.4.err")"
echo "  lookup: $(grep '^qwenc: draft:' "$tmp/greedy.lookup.4.err")"
# --draft-sample: greedy, the same text; sampled, drafts drawn from the head and kept by the rule (the rule's
# distribution is t_sampler's test): a whole run, drafts both kept and not
gen "$tmp/gs" 3 --draft-sample --temp 0 && cmp -s "$tmp/greedy.0" "$tmp/gs" && ok || bad "--draft-sample greedy: other text"
if gen "$tmp/ss" 3 --draft-sample --temp 0.8 --top-k 40 -s 1234; then
    line=$(grep '^qwenc: draft:' "$tmp/ss.err")
    drafted=$(sed -n 's/.*drafted \([0-9]*\), accepted.*/\1/p' <<<"$line")
    accepted=$(sed -n 's/.*accepted \([0-9]*\) (.*/\1/p' <<<"$line")
    [ "$(wc -w <"$tmp/ss")" -gt 100 ] && [ -n "$drafted" ] && [ "$accepted" -gt 0 ] && [ "$accepted" -lt "$drafted" ] && ok \
        || bad "--draft-sample sampled: $line"
    echo "  sampled, --draft 3 --draft-sample: $line"
else
    bad "--draft-sample sampled: $(tail -n 2 "$tmp/ss.err")"
fi
# --draft-src head without a head to draft with; --no-mtp leaves the head out, so auto drafts by lookup
expect_error "--draft-src head with --no-mtp" "no MTP draft head" $QWENC run -m $M -p hi -n 4 --draft 2 --draft-src head --no-mtp
$QWENC run -m $M -p "$P" -n 200 -t 2 --temp 0 --no-display-prompt --draft 3 --no-mtp >"$tmp/nomtp" 2>"$tmp/nomtp.err"
cmp -s <(head -c "$(wc -c <"$tmp/nomtp")" "$tmp/greedy.0") "$tmp/nomtp" && ok || bad "--no-mtp --draft 3: other text"

# chat: the same replies with drafts
printf 'Tell me of the king.\nAnd then?\n' >"$tmp/turns"
$QWENC chat -m $M --temp 0 -n 120 -t 2 <"$tmp/turns" >"$tmp/chat0" 2>/dev/null
$QWENC chat -m $M --temp 0 -n 120 -t 2 --draft 3 <"$tmp/turns" >"$tmp/chat3" 2>/dev/null
[ -s "$tmp/chat0" ] && cmp -s "$tmp/chat0" "$tmp/chat3" && ok || bad "chat --draft 3 answers otherwise than chat"

# serve --draft: one request at a time is drafted for; greedy and seeded replies are the ones without drafting
if command -v curl >/dev/null && command -v python3 >/dev/null; then
    source "$(dirname "$0")/lib_serve.sh"
    reqs='{"prompt":"'"$P"'","max_tokens":400,"temperature":0}
{"prompt":"'"$P"'","max_tokens":300,"temperature":0.8,"top_k":40,"seed":99}
{"messages":[{"role":"user","content":"Tell me of the king of Israel."}],"max_tokens":200,"temperature":0}'
    for d in 0 4; do
        start_server d$d -m $M -np 2 --draft $d || { finish; exit 1; }
        i=0
        while read -r body; do
            case "$body" in *messages*) ep=chat/completions ;; *) ep=completions ;; esac
            post /v1/$ep "$body" "$tmp/r$d.$i" >/dev/null
            i=$((i + 1))
        done <<<"$reqs"
        get /metrics "$tmp/m$d" >/dev/null
        stop_server
    done
    for i in 0 1 2; do
        a=$(jget "$tmp/r0.$i" 'j["choices"][0].get("text") or j["choices"][0]["message"]["content"]')
        b=$(jget "$tmp/r4.$i" 'j["choices"][0].get("text") or j["choices"][0]["message"]["content"]')
        [ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "serve --draft 4, request $i: [$b], without drafts [$a]"
    done
    drafted=$(sed -n 's/^qwenc_draft_tokens_total //p' "$tmp/m4") accepted=$(sed -n 's/^qwenc_draft_accepted_total //p' "$tmp/m4")
    [ "${drafted:-0}" -gt 0 ] && [ "${accepted:-0}" -gt 0 ] && [ "$accepted" -lt "$drafted" ] && ok \
        || bad "serve --draft 4: $accepted of $drafted drafted tokens accepted"
    echo "  serve --draft 4: $accepted of $drafted drafted tokens accepted"
fi

expect_error "--draft too large" "--draft must be at most 15" $QWENC run -m $M -p hi --draft 16
expect_error "--draft-src unknown" "--draft-src takes auto, head or lookup" $QWENC run -m $M -p hi --draft 2 --draft-src x
expect_error "--draft negative" "--draft" $QWENC run -m $M -p hi --draft -1
finish
