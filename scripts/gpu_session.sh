#!/usr/bin/env bash
# One lent GPU's work as one queue, within one device command (≤ 600 s):
#
#   scripts/gpu_session.sh [SECONDS]          # OUT: where what it finished goes (the device tool's $OUT)
#
# 1. A fixed first slot, the kernel check (scripts/gpu_kernels.py), capped at a quarter of SECONDS and at most
#    5 minutes (`timeout`): KERNELS=probe (default: its Mosaic GPU probe and the environment), full (the kernels'
#    tests and bench too) or none (its time goes to the queue); its log in $KERNELS_LOG (default $OUT/kernels.log).
# 2. The pre-registered plan's GPU units in plan order (docs/plan.json; python -m mx_proxy.experiments.plan_queue
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
SKIP="tests bench autotune cpu_tests"
KERNEL_S=$(( TOTAL / 4 < 300 ? TOTAL / 4 : 300 ))
case "${KERNELS:-probe}" in
  probe) ;;
  full) SKIP="autotune cpu_tests" ;;
  none) KERNEL_S=0 ;;
  *) echo "gpu session: KERNELS='$KERNELS'; valid: probe (default), full, none" >&2; exit 2 ;;
esac
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ "$KERNEL_S" -gt 0 ]; then
  START=$(date +%s)
  timeout --signal=INT "$(( KERNEL_S + 20 ))" python scripts/gpu_kernels.py --out "$OUT" --budget-s "$KERNEL_S" \
    --skip $SKIP 2>&1 | tee "${KERNELS_LOG:-$OUT/kernels.log}"
  echo "gpu session: kernel check done after $(( $(date +%s) - START )) s"
fi
LEFT=$(( END - $(date +%s) - 10 ))
if [ "$LEFT" -lt 1 ]; then
  echo "gpu session: no time left for the plan queue"
  exit 0
fi
python -m mx_proxy.experiments.plan_queue gpu --store "${PLAN_STORE:-/tmp/proxy-plan}" --export "$OUT/results/plan" \
  --committed "${PLAN_COMMITTED:-results/plan}" --seconds "$LEFT" --lean --quiet ${PLAN:+--plan "$PLAN"} \
  ${PLAN_OPTIONS-}
