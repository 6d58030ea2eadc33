#!/usr/bin/env bash
# ctest entry: every kiln program, fed bad values, exits non-zero with a message naming the
# flag and never crashes; --help and --version print on stdout and exit 0; every JSON output,
# a run whose loss is NaN included, parses. KILN_MPIEXEC, where set, runs the MPI programs.
#   check_command_lines.sh MNIST_DIR PROGRAM...
set -uo pipefail
data="$1"
shift
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# expect_rejected PROGRAM FLAG ARGS...: non-zero, not a signal, and FLAG named on stderr.
expect_rejected() {
  local program="$1" flag="$2"
  shift 2
  "$program" "$@" >"$work/out" 2>"$work/err"
  local status=$?
  local name
  name="$(basename "$program")"
  if [[ $status -eq 0 ]]; then
    fail "$name $* exited 0"
  elif [[ $status -ge 128 ]]; then
    fail "$name $* died of signal $((status - 128))"
  elif ! grep -qF -- "$flag" "$work/err"; then
    fail "$name $* exited $status without naming $flag: $(head -c 300 "$work/err")"
  else
    echo "ok: $name $* -> $status: $(head -n 1 "$work/err")"
  fi
}

expect_help_and_version() {
  local program="$1" name
  name="$(basename "$program")"
  if ! "$program" --help >"$work/out" 2>"$work/err" || ! grep -q -- "--version" "$work/out"; then
    fail "$name --help did not print its flags on stdout with exit 0"
  fi
  if ! "$program" --version >"$work/out" 2>&1 || ! grep -q "kiln" "$work/out"; then
    fail "$name --version did not print the version with exit 0"
  fi
}

expect_json() {
  local what="$1" file="$2"
  if ! python3 -m json.tool "$file" >/dev/null 2>"$work/json_err"; then
    fail "$what wrote JSON that does not parse: $(cat "$work/json_err")"
  else
    echo "ok: $what wrote JSON that parses"
  fi
}

step_flags_rejected() {
  local p="$1"
  expect_rejected "$p" --rounds --rounds 0
  expect_rejected "$p" --rounds --rounds=x
  expect_rejected "$p" --batch --batch 0
  expect_rejected "$p" --batch --batch 99999999999999999999
  expect_rejected "$p" --steps --steps 1junk
  expect_rejected "$p" --json --json "$work/no/such/dir/out.json"
  expect_rejected "$p" --bogus --bogus
}

for program in "$@"; do
  expect_help_and_version "$program"
  case "$(basename "$program")" in
  mnist_train)
    expect_rejected "$program" --epochs --epochs=abc
    expect_rejected "$program" --epochs --epochs 0
    expect_rejected "$program" --lr --lr 1e-2junk
    expect_rejected "$program" --lr --lr nan
    expect_rejected "$program" --lr -l -1
    expect_rejected "$program" --seed --seed -1
    expect_rejected "$program" --momentum --momentum 2
    expect_rejected "$program" --threads --threads -1
    expect_rejected "$program" --batch --batch 0
    expect_rejected "$program" --batch --data "$data" --batch 10000
    expect_rejected "$program" --model --model vgg
    expect_rejected "$program" --precision --precision fp16
    expect_rejected "$program" --json --data "$data" --json "$work/no/such/dir/out.json"
    expect_rejected "$program" --disable --disable layout,fuse_nothing
    expect_rejected "$program" --data --data "$work/no/such/dir"
    expect_rejected "$program" --bogus --bogus
    "$program" --data "$data" --smoke --threads 2 --json "$work/smoke.json" >/dev/null &&
      expect_json "mnist_train --smoke" "$work/smoke.json" || fail "mnist_train --smoke failed"
    # --tune measures and caches; the same command again reads the cache; a cache path that is
    # a folder is reported in the tuning line, and training goes on.
    for run in measures reads; do
      KILN_TUNING_CACHE="$work/tuning.json" "$program" --data "$data" --smoke \
        --threads 2 --tune --explain-fusion >"$work/tune_$run" 2>&1 ||
        fail "mnist_train --tune ($run) failed: $(tail -n 3 "$work/tune_$run")"
    done
    grep -q '^tuned in [0-9.]* s: step' "$work/tune_measures" &&
      grep -q '^tuned decisions' "$work/tune_measures" ||
      fail "mnist_train --tune did not print its tuning and decisions"
    grep -q "^tuning read from $work/tuning.json" "$work/tune_reads" ||
      fail "a second mnist_train --tune did not read the cache"
    mkdir -p "$work/cache_folder"
    KILN_TUNING_CACHE="$work/cache_folder" "$program" --data "$data" --smoke \
      --threads 2 --tune >"$work/out" 2>&1 || fail "mnist_train --tune with a folder as cache failed"
    grep -q "is not a kiln tuning cache" "$work/out" ||
      fail "mnist_train --tune did not report a cache it could not use: $(grep tun "$work/out")"
    # A learning rate this large drives the loss to NaN: the run stops at that step, naming it...
    "$program" --data "$data" --model lenet5 --epochs 1 --batch 500 --lr 3e38 --threads 2 \
      >/dev/null 2>"$work/err" && fail "mnist_train --lr 3e38 trained on past a NaN loss"
    grep -qE 'kiln.runtime.not_finite\] run [0-9]+: output %[0-9]+ is -?(nan|inf)' "$work/err" ||
      fail "mnist_train --lr 3e38 did not name the step whose loss was NaN: $(cat "$work/err")"
    # ...or, allowed to go on, still writes valid JSON.
    "$program" --data "$data" --model lenet5 --epochs 1 --batch 500 --lr 3e38 --threads 2 \
      --allow-non-finite --json "$work/nan.json" >/dev/null
    expect_json "mnist_train --lr 3e38" "$work/nan.json"
    grep -q '"final_loss": null' "$work/nan.json" || fail "the NaN loss is not written as null"
    ;;
  step_bench | fusion_bench | vs_libtorch)
    step_flags_rejected "$program"
    if [[ "$(basename "$program")" == step_bench ]]; then
      expect_rejected "$program" --threads --threads 1,0
      expect_rejected "$program" --threads --threads 1,,x
      "$program" --threads 2,1 --rounds 1 --steps 1 --batch 8 --json "$work/threads.json" \
        >"$work/out" || fail "step_bench --threads 2,1 failed"
      python3 -c 'import json, sys
rows = json.load(open(sys.argv[1]))["results"]
assert [r["threads"] for r in rows] == [2, 1], rows
assert rows[0]["speedup"] == 1.0 and rows[0]["efficiency"] == 1.0, rows[0]
assert abs(rows[1]["speedup"] - rows[0]["ms_per_step"] / rows[1]["ms_per_step"]) < 1e-9, rows
assert abs(rows[1]["efficiency"] - 2 * rows[1]["speedup"]) < 1e-9, rows
import os
cpus = sorted(os.sched_getaffinity(0))
distance = json.load(open(sys.argv[1]))["core_distance"]
if len(cpus) > 1:
    assert distance["cores"] == [cpus[0], cpus[-1]], distance
    # Nanoseconds: above a cache hit, below the 20 ms after which the probe stops.
    assert len(distance["round_trip_ns"]) == 1 and 1 < distance["round_trip_ns"][0] <= 2.5e7, distance
else:
    assert "cores" not in distance and distance["round_trip_ns"] == [], distance
assert distance["moved"] is False, distance' "$work/threads.json" ||
        fail "step_bench --threads 2,1 wrote the wrong rows: $(cat "$work/threads.json")"
    fi
    "$program" --rounds 1 --steps 1 --batch 8 --json "$work/bench.json" >/dev/null &&
      expect_json "$(basename "$program")" "$work/bench.json" ||
      fail "$(basename "$program") --rounds 1 failed"
    ;;
  accuracy_vs_libtorch)
    expect_rejected "$program" --seeds --seeds 1
    expect_rejected "$program" --epochs --epochs 0
    expect_rejected "$program" --model --model resnet50
    expect_rejected "$program" --lr-decay --lr-decay 2
    expect_rejected "$program" --lr-decay --lr-decay 0
    expect_rejected "$program" --json --json "$work/no/such/dir/out.json"
    expect_rejected "$program" "$work/none" --data "$work/none"
    # The smallest real comparison, 2 seeds a side for one epoch of the MNIST split: about 25 s
    # on 2 cores, and only where libtorch is installed.
    "$program" --data "$data" --seeds 2 --epochs 1 --json "$work/accuracy.json" >"$work/out" ||
      fail "accuracy_vs_libtorch --seeds 2 --epochs 1 failed"
    python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
assert [(x["library"], x["seed"]) for x in r["runs"]] == [("kiln", 1), ("libtorch", 1), ("kiln", 2), ("libtorch", 2)], r["runs"]
for x in r["runs"]:
    assert len(x["test_accuracy_percent"]) == 1 and 80 < x["test_accuracy_percent"][0] <= 100, x
e = r["epochs"][0]
assert e["difference_95_low"] <= e["difference"] <= e["difference_95_high"], e
assert e["paired_95_low"] <= e["difference"] <= e["paired_95_high"], e
k = [x["test_accuracy_percent"][0] for x in r["runs"] if x["library"] == "kiln"]
t = [x["test_accuracy_percent"][0] for x in r["runs"] if x["library"] == "libtorch"]
d = [a - b for a, b in zip(k, t)]
half = 12.706 * abs(d[0] - d[1]) / 2  # t(1) x sd / sqrt(2) of two differences
assert abs(e["paired_95_high"] - e["paired_95_low"] - 2 * half) < 1e-6, (e, d)
assert abs(e["difference"] - (e["kiln_mean"] - e["libtorch_mean"])) < 1e-9, e' "$work/accuracy.json" ||
      fail "accuracy_vs_libtorch wrote unexpected JSON: $(head -c 600 "$work/accuracy.json")"
    ;;
  data_parallel_bench)
    step_flags_rejected "$program"
    expect_rejected "$program" --batch --batch 7
    expect_rejected "$program" --link-gbit --link-gbit 0
    expect_rejected "$program" --link-latency-us --link-latency-us -1
    # Without mpirun it is one rank, and says how to start it.
    expect_rejected "$program" "mpirun -np 2" --rounds 1
    if [[ -n "${KILN_MPIEXEC:-}" ]]; then
      "$KILN_MPIEXEC" --allow-run-as-root --oversubscribe -np 2 --mca btl self,tcp "$program" \
        --rounds 1 --steps 1 --batch 8 --json "$work/dp.json" >/dev/null &&
        expect_json "data_parallel_bench" "$work/dp.json" || fail "data_parallel_bench failed"
    fi
    ;;
  gemm_conv_micro)
    expect_rejected "$program" --threads --threads 0
    expect_rejected "$program" --repeats --repeats 0
    expect_rejected "$program" --repeats -r abc
    expect_rejected "$program" "were not expected" 1 0
    expect_rejected "$program" --only --only "no such shape"
    expect_rejected "$program" --precision --precision f64
    if "$program" --repeats 1 --only "dW, NHWC" >"$work/micro" 2>"$work/err"; then
      rows="$(grep -c "dW, NHWC" "$work/micro")"
      others="$(tail -n +3 "$work/micro" | grep -vc "dW, NHWC")"
      [[ $rows -eq 5 && $others -eq 0 ]] ||
        fail "gemm_conv_micro --only 'dW, NHWC' timed $rows such shapes and $others others"
    else
      fail "gemm_conv_micro --only failed: $(head -c 300 "$work/err")"
    fi
    ;;
  gemm_bench)
    expect_rejected "$program" --bogus --bogus
    "$program" --benchmark_filter='kiln_matmul/M:64/N:576' --benchmark_min_time=0.01 \
      --benchmark_format=json >"$work/gemm.json" &&
      expect_json "gemm_bench --benchmark_format=json" "$work/gemm.json" || fail "gemm_bench failed"
    ;;
  *)
    fail "no bad values known for $program"
    ;;
  esac
done
echo "$failures failures"
[[ $failures -eq 0 ]]
