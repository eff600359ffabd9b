#!/usr/bin/env bash
# Where a decode token's (or a prompt step's) time goes on the GPU, kernel by kernel: Nsight Compute (ncu) times N
# kernels of a benchmark on a random model after the first SKIP (the warm-up and prefill), each kernel alone, and
# prints per kernel name the launches, the mean time, the DRAM bytes read, the registers a thread, the achieved
# occupancy (warps active against the SM's most) and the share of the total. Needs ncu (the CUDA toolkit) and
# python3.
#
#   bash tests/gpu/profile.sh [qwenc bench model options]     (default: the Flash-Next cut, Q4_K)
#   SKIP=3000 N=1300: the kernels skipped and the kernels timed; NCU_FLAGS: more ncu options (--clock-control none
#   --cache-control none: the GPU's own clocks and warm caches, nearer a real token)
#   P=4096: a prompt step of P tokens instead of decode (bench -p P -n 0; with SKIP=0 the warm-up pass comes
#   first: N of about twice a step's kernels covers it and the timed pass). ncu saves and restores what each
#   kernel writes, so a model of few layers (--layers 2 keeps a layer's shapes) profiles in seconds where the
#   whole model takes minutes a kernel.
#   STALLS=REGEX: instead, what bounds the first N (default 3) kernels whose names match REGEX after SKIP of them:
#   ncu's scheduler, warp-state (the stall reasons), compute and memory sections, as ncu prints them.
set -u
cd "$(dirname "$0")/../.." || exit 1
Q=${QWENC:-build-cuda/qwenc}
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--synth flash-next --layers 8 --experts 64 --ngram-base 200003 --type Q4_K)
csv=$(mktemp)
trap 'rm -f "$csv"' EXIT
steps=(-p 0 -n 64)
[ -n "${P:-}" ] && steps=(-p "$P" -n 0)
if [ -n "${STALLS:-}" ]; then
    # shellcheck disable=SC2086
    "$NCU" ${NCU_FLAGS:-} -k "regex:$STALLS" --launch-skip "${SKIP:-0}" --launch-count "${N:-3}" \
        --section SchedulerStats --section WarpStateStats --section ComputeWorkloadAnalysis \
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats "$Q" bench "${args[@]}" \
        --backend cuda "${steps[@]}" -r 1 2>&1 | grep -v '^==PROF==' | grep -Ev '^ *(-+ +)+-+ *$'
    exit "${PIPESTATUS[0]}"
fi
metrics=gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread
metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active
# shellcheck disable=SC2086
"$NCU" ${NCU_FLAGS:-} --metrics "$metrics" --launch-skip "${SKIP:-3000}" --launch-count "${N:-1300}" --csv "$Q" bench \
    "${args[@]}" --backend cuda "${steps[@]}" -r 1 >"$csv" 2>/dev/null
python3 - "$csv" <<'PY'
import csv, sys, collections
rows = []
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    rows.append(r)
if not rows:
    sys.exit("profile: ncu recorded no kernels")
t = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])  # calls, us, bytes, registers, occupancy %
for r in rows:
    name = r["Kernel Name"].split("(")[0].split("<")[0].replace("void ", "")
    key = (name, r["Kernel Name"][:80])
    v = float(r["Metric Value"].replace(",", ""))
    unit = r["Metric Unit"].lower()
    m = r["Metric Name"]
    if m == "gpu__time_duration.sum":
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
        t[key][0] += 1
        t[key][1] += v * scale[unit]
    elif m == "dram__bytes_read.sum":
        scale = {"b": 1, "byte": 1, "kb": 1e3, "kbyte": 1e3, "mb": 1e6, "mbyte": 1e6, "gb": 1e9, "gbyte": 1e9}
        t[key][2] += v * scale[unit]
    elif m == "launch__registers_per_thread":
        t[key][3] += v
    elif m.startswith("sm__warps_active"):
        t[key][4] += v
tot = sum(x[1] for x in t.values())
n = sum(x[0] for x in t.values())
print(f"{n} kernels, {tot:.0f} us in all")
print(f"{'kernel':80s} {'calls':>6s} {'us/call':>8s} {'GB/s':>7s} {'regs':>5s} {'occ %':>6s} {'share':>6s}")
for key, (c, us, b, regs, occ) in sorted(t.items(), key=lambda kv: -kv[1][1]):
    print(f"{key[1]:80s} {c:6d} {us / c:8.2f} {b / us / 1e3 if us else 0:7.0f} {regs / c:5.0f} {occ / c:6.1f} "
          f"{100 * us / tot:5.1f}%")
PY
