#!/usr/bin/env bash
# The GPU checks, in one call on a machine with CUDA (a lent device is held by the minute).
# PARTS (default "kernels validate tests") picks among:
#   kernels   benchmarks/gpu_kernels.py           the kernel rates the speed model assumes, measured
#   validate  benchmarks/gpu_validate.py          trainfit's probe of 19 configurations (measure
#             only: the comparison with plan runs anywhere, `gpu_validate.py --compare`)
#   launch    benchmarks/gpu_validate.py --launch the launch-bound configurations (added to the file)
#   overhead  benchmarks/gpu_launch_overhead.py   the CPU cost of one eager op on this host
#   attention benchmarks/gpu_validate.py --attention  long sequences (added to the file)
#   expandable benchmarks/gpu_validate.py --expandable  steps run with expandable segments (added)
#   here      benchmarks/gpu_validate.py --compare --here  plan made on the GPU's own host, of this
#             run's measurements (put it after the measuring parts) or else the committed ones
#   sdpa      benchmarks/gpu_sdpa_choice.py       the kernel SDPA picks for transformers' inputs
#   trace     benchmarks/gpu_memory_trace.py      the allocator's event record of chosen probes
#   trace-steps / trace-kernels  the same over 4 more steps / with the kernels run (profiler)
#   tests     the CUDA-only tests (skipped without CUDA): tune's probe, offload, the allocator
#             setting, doctor's CUDA round
# Results go to $OUT (default benchmarks/results), the logs to $OUT/run.log; NAME=h200 keeps
# another device's measurements in gpu_measured_h200.json. LIMIT_<PART>=S overrides a part's
# time limit (LIMIT_VALIDATE=200). Wheels in .whl/ (the versions trainfit pins: transformers,
# peft; trl and datasets for the offload test) are installed to /tmp/site first when present;
# if they do not import there, the machine's own versions are used and the log says so. Each
# part has its own time limit, so one that hangs cannot take the others' time.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
PARTS=${PARTS:-kernels validate tests}
NAMEARG=${NAME:+--name $NAME}
mkdir -p "$OUT"
LOG=$OUT/run.log
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit,pcie.link.gen.max \
    --format=csv > "$OUT/nvidia_smi.csv" 2>&1
cat "$OUT/nvidia_smi.csv"
if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
    TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
versions='import torch, transformers, peft; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "peft", peft.__version__)'
if ! python3 -c "$versions"; then
    echo "the pinned wheels do not import here: the machine's own transformers/peft are used"
    export PYTHONPATH=$PWD/src
    python3 -c "$versions"
fi
part() {  # part NAME LIMIT_S COMMAND...
    local name=$1 limit=$2 t0=$SECONDS over
    over=LIMIT_$(echo "$1" | tr 'a-z-' 'A-Z_')
    limit=${!over:-$limit}
    shift 2
    echo "=== $name" >> "$LOG"
    timeout "$limit" "$@" >> "$LOG" 2>&1
    echo "$name: exit $? after $((SECONDS - t0)) s" | tee -a "$LOG"
}
for p in $PARTS; do
    case $p in
        kernels) part kernels 100 python3 benchmarks/gpu_kernels.py --out "$OUT" $NAMEARG ;;
        validate) part validate 300 python3 benchmarks/gpu_validate.py --out "$OUT" $NAMEARG ;;
        launch) part launch 120 python3 benchmarks/gpu_validate.py --launch --out "$OUT" $NAMEARG ;;
        overhead) part overhead 60 python3 benchmarks/gpu_launch_overhead.py --out "$OUT" $NAMEARG ;;
        sdpa) part sdpa 60 python3 benchmarks/gpu_sdpa_choice.py --out "$OUT" ;;
        reserve) part reserve 150 python3 benchmarks/gpu_validate.py --reserve --out "$OUT" ;;
        attention) part attention 120 python3 benchmarks/gpu_validate.py --attention --out "$OUT" \
            $NAMEARG ;;
        expandable) part expandable 200 python3 benchmarks/gpu_validate.py --expandable --out "$OUT" \
            $NAMEARG ;;
        trace) part trace 120 python3 benchmarks/gpu_memory_trace.py --out "$OUT" ;;
        trace-steps) part trace-steps 90 python3 benchmarks/gpu_memory_trace.py --only 2,3 --steps 4 \
            --name gpu_memory_traces_steps --out "$OUT" ;;
        trace-kernels) part trace-kernels 90 python3 benchmarks/gpu_memory_trace.py --only 0 --kernels \
            --name gpu_memory_traces_kernels --out "$OUT" ;;
        # plan's prediction made on the GPU's own host, as a user's plan there is (its host steps
        # timed on that CPU), of this run's measurements or else the committed ones
        here) measured="gpu_measured${NAME:+_$NAME}.json"
            [ -f "$OUT/$measured" ] || cp "benchmarks/results/$measured" "$OUT/"
            part here 540 python3 benchmarks/gpu_validate.py --compare --here --out "$OUT" $NAMEARG ;;
        tests) part tests 150 python3 -m pytest -q -p no:cacheprovider -W ignore -rs \
            tests/tune/test_probe_cuda.py tests/model/test_offload.py \
            tests/doctor/test_doctor_job.py::test_a_cuda_round_carries_the_cards_reserved_peak \
            tests/model/test_runtime.py ;;
        *) echo "unknown part $p" ;;
    esac
done
grep -E '^\| (GEMM bf16 best|SDPA default)|"status"|events|passed|failed|host_s' "$LOG" | cut -c1-220 | tail -n 60
