export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu
DEPS=$PWD/.deps J=16 bash tests/gpu_check.sh > $OUT/check.txt 2>&1; grep -E '^==|passed|FAIL|ERROR|error' $OUT/check.txt | head -40
cut="--synth flash-next --layers 8 --experts 64 --ngram-base 200003"
for t in Q4_K Q8_0 BF16; do
 echo "$t: $(build-cuda/qwenc bench $cut --type $t --backend cuda -p 512 -n 128 -r 2 2>&1 | grep -E 'pp512|tg128|bound' | cut -c70- | tr '\n' ' ')"; done
echo "whole Q4_K: $(build-cuda/qwenc bench --synth flash-next --type Q4_K --backend cuda -p 0 -n 64 -r 2 2>&1 | grep -E 'tg64|bound' | cut -c70- | tr '\n' ' ')"
echo "35B Q4_K: $(build-cuda/qwenc bench --synth qwen3.5-35b-a3b --type Q4_K --backend cuda -p 512 -n 128 -r 2 2>&1 | grep -E 'pp512|tg128|bound' | cut -c70- | tr '\n' ' ')"
