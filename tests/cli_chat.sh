#!/usr/bin/env bash
# End-to-end tests of `qwenc chat` (stdin a pipe or a FIFO) and `qwenc run` when a turn goes wrong: invalid
# UTF-8 read as U+FFFD, a message the template refuses or that holds a NUL byte not sent while the
# conversation goes on, a full context refused with /reset offered or, with --context-shift, the oldest turns
# dropped; Ctrl-C (SIGINT) stops a reply and the next message is answered, Ctrl-C at the prompt quits, and
# Ctrl-C during `run` stops it with the statistics.
source "$(dirname "$0")/lib_cli.sh"
M=models/tiny-flash
fed() { grep -c '^\[fed ' "$1"; }
wait_for() { for _ in $(seq 1200); do "$@" && return 0; sleep 0.05; done; return 1; }
bigger() { [ "$(stat -c %s "$1")" -gt "$2" ]; }
fed_ge() { [ "$(fed "$1")" -ge "$2" ]; }
gone() { ! kill -0 "$1" 2>/dev/null; }

# --- invalid UTF-8 is read as U+FFFD (each invalid byte here is one): the same tokens as the replaced text
printf 'ab\xff\xfecd\nAnd what then?\n' | $QWENC chat -m $M -n 4 --temp 0 >"$tmp/out" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && [ "$(fed "$tmp/err")" -eq 2 ] && ok || bad "chat with invalid UTF-8: rc $rc, $(cat "$tmp/err")"
printf 'ab\xef\xbf\xbd\xef\xbf\xbdcd\n' | $QWENC chat -m $M -n 4 --temp 0 >"$tmp/out2" 2>"$tmp/err2"
first_fed() { sed -n '1s/^\[fed \([0-9]*\) tokens.*/\1/p' <(grep '^\[fed' "$1"); }
[ -n "$(first_fed "$tmp/err")" ] && [ "$(first_fed "$tmp/err")" = "$(first_fed "$tmp/err2")" ] && \
    [ "$(head -1 "$tmp/out")" = "$(head -1 "$tmp/out2")" ] && ok \
    || bad "invalid UTF-8 turn differs from its U+FFFD reading: $(head -1 "$tmp/err") / $(head -1 "$tmp/err2")"
$QWENC run -m $M --chat -p "$(printf 'ab\xffcd')" -n 2 --temp 0 >/dev/null 2>"$tmp/err" && ok \
    || bad "run --chat with invalid UTF-8: $(cat "$tmp/err")"

# --- a message the template refuses is not sent; the conversation goes on (a template that raises on a word)
mkdir "$tmp/m"
for f in "$PWD"/$M/*; do ln -s "$f" "$tmp/m/"; done
cat >"$tmp/m/chat_template.jinja" <<'EOF'
{%- for message in messages %}{%- if 'forbidden' in message['content'] %}{{ raise_exception('this template refuses the word forbidden') }}{%- endif %}{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}
EOF
printf 'And the LORD said\nthis is forbidden\nAnd what then?\n' | $QWENC chat -m "$tmp/m" -n 4 --temp 0 >"$tmp/out" 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && [ "$(fed "$tmp/err")" -eq 2 ] && ok || bad "refused turn: rc $rc, $(cat "$tmp/err")"
grep -q "raise_exception: this template refuses the word forbidden" "$tmp/err" && grep -q "the message was not sent; the conversation goes on" "$tmp/err" \
    && ok || bad "refused turn: no reason given: $(cat "$tmp/err")"
# the third turn continues the session of the first (the tokens before it are the first turn's)
read -r ctx1 < <(sed -n '1s/.*, \([0-9]*\) in context.*/\1/p' <(grep '^\[fed' "$tmp/err"))
read -r fed3 ctx3 < <(sed -n '2s/^\[fed \([0-9]*\) tokens.*, \([0-9]*\) in context.*/\1 \2/p' <(grep '^\[fed' "$tmp/err"))
[ -n "$ctx3" ] && [ $((ctx3 - fed3)) -ge "$ctx1" ] && ok \
    || bad "after a refused turn: fed $fed3, $ctx3 in context (first turn: $ctx1): the session started over"
# a NUL byte in a message
printf 'a\0b\nAnd what then?\n' | $QWENC chat -m $M -n 2 --temp 0 >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && [ "$(fed "$tmp/err")" -eq 1 ] && grep -q "NUL byte at offset 1" "$tmp/err" && ok || bad "NUL turn: rc $rc, $(cat "$tmp/err")"

# --- a full context: said, /reset offered and working; with --context-shift the oldest turns are dropped
turns='The old man walked slowly.\nAnd what did the dog do then?\nAnd then?\nAnd more?\nYes?\n'
printf "$turns/reset\nAnd then?\n" | $QWENC chat -m $M -n 16 --temp 0 -c 80 >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && grep -q "qwenc: context full: .* of 80 tokens are in use and this turn needs .* more: type /reset" "$tmp/err" \
    && ok || bad "full context: rc $rc, $(cat "$tmp/err")"
tail -1 "$tmp/err" | grep -q '^\[fed .*stop: token limit\]' && grep -q "(conversation reset)" "$tmp/err" && ok \
    || bad "/reset after a full context: $(tail -3 "$tmp/err")"
printf "$turns" | $QWENC chat -m $M -n 16 --temp 0 -c 80 --context-shift -sys "Be brief." >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 0 ] && [ "$(fed "$tmp/err")" -eq 5 ] && ! grep -q "qwenc: context full" "$tmp/err" && ok \
    || bad "--context-shift: rc $rc, $(cat "$tmp/err")"
grep -q "(context full: dropped the [0-9]* oldest turn" "$tmp/err" && ok || bad "--context-shift dropped nothing: $(cat "$tmp/err")"
max=$(sed -n 's/.*, \([0-9]*\) in context.*/\1/p' "$tmp/err" | sort -n | tail -1)
[ "$max" -le 80 ] && ok || bad "--context-shift: $max tokens in a context of 80"
printf 'The old man walked slowly.\nAnd what then?\n' | $QWENC chat -m $M -n -1 --temp 0 -c 60 >/dev/null 2>"$tmp/err"
grep -q "(context full at 60 tokens: the reply was cut; type /reset" "$tmp/err" && grep -q "context full: 60 of 60" "$tmp/err" \
    && ok || bad "a reply cut by the context: $(cat "$tmp/err")"

# --- Ctrl-C: stops a reply (the conversation goes on), and at the prompt quits. The replies are long (greedy
# until a context of 16384 is full) so that each signal arrives while its reply is being written.
mkfifo "$tmp/in"
$QWENC chat -m $M -n -1 -c 16384 --temp 0 <"$tmp/in" >"$tmp/out" 2>"$tmp/err" & pid=$!
exec 7>"$tmp/in"
echo "Tell me about the king." >&7
if wait_for bigger "$tmp/out" 0; then
    kill -INT $pid
    wait_for fed_ge "$tmp/err" 1 && ok || bad "Ctrl-C did not stop the first reply"
    size=$(stat -c %s "$tmp/out")
    echo "And what then?" >&7
    wait_for bigger "$tmp/out" $((size + 1)) && kill -INT $pid
    wait_for fed_ge "$tmp/err" 2 && ok || bad "the second message was not answered, or Ctrl-C did not stop it"
    sleep 0.2 # at the prompt
    kill -INT $pid
fi
wait_for gone $pid || kill -9 $pid
exec 7>&-
wait $pid; rc=$?
[ $rc -eq 0 ] && ok || bad "chat after Ctrl-C at the prompt: exit $rc"
[ "$(grep -c 'stop: interrupted (Ctrl-C)\]' "$tmp/err")" -eq 2 ] && grep -q "interrupted at the prompt: bye" "$tmp/err" && ok \
    || bad "chat Ctrl-C: $(cat "$tmp/err")"
n1=$(sed -n '1s/.*generated \([0-9]*\) tokens.*/\1/p' <(grep '^\[fed' "$tmp/err"))
[ -n "$n1" ] && [ "$n1" -gt 0 ] && [ "$n1" -lt 16000 ] && ok || bad "the first reply ran $n1 tokens"

# SIGTERM stops the reply and ends the chat (exit 143)
exec 7<>"$tmp/in"
$QWENC chat -m $M -n -1 -c 16384 --temp 0 <"$tmp/in" >"$tmp/out" 2>"$tmp/err" & pid=$!
echo "Tell me about the king." >&7
if wait_for bigger "$tmp/out" 0; then kill -TERM $pid; fi
wait_for gone $pid || kill -9 $pid
wait $pid; rc=$?
exec 7>&-
[ $rc -eq 143 ] && grep -q "stop: terminated (SIGTERM)\]" "$tmp/err" && ok || bad "chat SIGTERM: rc $rc, $(cat "$tmp/err")"

# run: Ctrl-C stops the generation, prints the statistics and exits 130
$QWENC run -m $M -p "And the LORD" -n -1 -c 16384 --temp 0 >"$tmp/out" 2>"$tmp/err" & pid=$!
if wait_for bigger "$tmp/out" 40; then kill -INT $pid; fi
wait $pid; rc=$?
[ $rc -eq 130 ] && grep -qE "generated [0-9]+ tokens .* stop: interrupted" "$tmp/err" && ok || bad "run Ctrl-C: rc $rc, $(cat "$tmp/err")"

finish
