#!/usr/bin/env bash
# One lent GPU's work as one queue, within one device command (≤ 600 s):
#
#   scripts/gpu_session.sh [SECONDS]          # OUT: where what it finished goes (the device tool's $OUT)
#
# 1. A fixed first slot, the kernel check (scripts/gpu_kernels.py), capped at a quarter of SECONDS (half with
#    KERNELS=mosaic) and at most 5 minutes (`timeout`): KERNELS=probe (default: its Mosaic GPU probe and the
#    environment), mosaic (the probe, the environment and the Mosaic GPU MX GEMM: checked, autotuned and timed,
#    scripts/gpu_mosaic.py, results in $OUT/mosaic_gemm.json), full (the Triton kernels' tests and bench too, no
#    Mosaic GEMM) or none (its time goes to the queue); its log in $KERNELS_LOG (default $OUT/kernels.log).
# 2. Optionally (BENCH=members; default BENCH=none) `mx-proxy bench members` at the paper's width, capped at half the
#    time left and 5 minutes, its log in $BENCH_LOG (default $OUT/bench_members.log; each row is printed as it is
#    measured, so a capped run keeps its rows) and a jax.profiler trace in $OUT/profile; $BENCH_OPTIONS replaces its
#    options (default: width 512, batch 2048, the three recipes, no twin, diagnostics every 50 and never, groups of
#    8 16 32 64, 50-step segments).
# 3. The pre-registered plan's GPU units in plan order (docs/plan.json; python -m mx_proxy.experiments.plan_queue
#    gpu), lean (mx_proxy.experiments.lean: diagnostics only where the plan scores warning signals), with the time
#    left as their budget: no unit starts without 30 s of it, and the unit running when it is spent stops at the end
#    of its segment, checkpointed in the store ($PLAN_STORE, default /tmp/proxy-plan: a second call on the same warm
#    machine resumes it there; a machine given back takes the store with it). Every finished member is exported to
#    $OUT/results/plan/<study>/; the members committed in the tree (results/plan/<study>/, or $PLAN_COMMITTED) are
#    not trained again and a fresh store resumes from them, so the next window continues the plan once this one's
#    members are committed. It prints the member-steps of the members it finished, per second, and what is left.
#    $PLAN (another plan file, e.g. a test's) and $PLAN_OPTIONS (more options, e.g. `--group-size 16`) are passed on.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:?scripts/gpu_session.sh needs OUT, the folder what it finishes goes to}"
TOTAL="${1:-520}"
END=$(( $(date +%s) + TOTAL ))
SKIP="mosaic tests bench autotune cpu_tests"
KERNEL_S=$(( TOTAL / 4 < 300 ? TOTAL / 4 : 300 ))
case "${KERNELS:-probe}" in
  probe) ;;
  mosaic) SKIP="tests bench autotune cpu_tests"; KERNEL_S=$(( TOTAL / 2 < 300 ? TOTAL / 2 : 300 )) ;;
  full) SKIP="mosaic autotune cpu_tests" ;;
  none) KERNEL_S=0 ;;
  *) echo "gpu session: KERNELS='$KERNELS'; valid: probe (default), full, none, mosaic" >&2; exit 2 ;;
esac
case "${BENCH:-none}" in
  none|members) ;;
  *) echo "gpu session: BENCH='$BENCH'; valid: none (default), members" >&2; exit 2 ;;
esac
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ "$KERNEL_S" -gt 0 ]; then
  START=$(date +%s)
  timeout --signal=INT "$(( KERNEL_S + 20 ))" python scripts/gpu_kernels.py --out "$OUT" --budget-s "$KERNEL_S" \
    --skip $SKIP 2>&1 | tee "${KERNELS_LOG:-$OUT/kernels.log}"
  echo "gpu session: kernel check done after $(( $(date +%s) - START )) s"
fi
if [ "${BENCH:-none}" = members ]; then
  BENCH_S=$(( (END - $(date +%s)) / 2 ))
  BENCH_S=$(( BENCH_S < 300 ? BENCH_S : 300 ))
  DEFAULT_BENCH="--width 512 --batch 2048 --twin no --diagnostics 50 never --members 8,16,32,64 --steps 50"
  timeout --signal=INT "$BENCH_S" python -m mx_proxy.cli bench members ${BENCH_OPTIONS:-$DEFAULT_BENCH} \
    --profile "$OUT/profile" 2>&1 | tee "${BENCH_LOG:-$OUT/bench_members.log}"
fi
LEFT=$(( END - $(date +%s) - 10 ))
if [ "$LEFT" -lt 1 ]; then
  echo "gpu session: no time left for the plan queue"
  exit 0
fi
python -m mx_proxy.experiments.plan_queue gpu --store "${PLAN_STORE:-/tmp/proxy-plan}" --export "$OUT/results/plan" \
  --committed "${PLAN_COMMITTED:-results/plan}" --seconds "$LEFT" --lean --quiet ${PLAN:+--plan "$PLAN"} \
  ${PLAN_OPTIONS-}
