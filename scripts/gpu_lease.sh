#!/usr/bin/env bash
# Everything one lent GPU does in one device command, packed so that it comes back:
#
#   scripts/gpu_lease.sh [SECONDS]        # e.g. run(command="bash scripts/gpu_lease.sh 560", timeout_s=600)
#
# The device tool returns at most 8 files from $OUT, no more than two folders down, so the exports the GPU
# scripts write under $OUT/results/ensembles/NAME/MEMBER/ would not come back as they are. This runs the kernel
# check (scripts/gpu_kernels.py, at most a quarter of SECONDS: by default only its Mosaic GPU probe and the
# environment, the kernels' tests and bench having been measured on 2026-12-04; KERNELS=full adds them) and then
# the ensembles (scripts/gpu_session.sh, the rest) with $OUT pointed at a staging folder, and packs that folder
# into $OUT/gpu_out.tar.gz with the two logs beside it. Unpack the archive in the repository root
# (`tar xzf gpu_out.tar.gz`): its paths are the repository's (results/..., plus gpu_kernels.log and
# gemm_tuning.json at its top).
set -uo pipefail
cd "$(dirname "$0")/.."
TOTAL="${1:-560}"
RETURN="${OUT:?scripts/gpu_lease.sh needs OUT, the device machine output folder}"
STAGE="$(mktemp -d /tmp/gpu-lease.XXXXXX)"
trap 'rm -rf "$STAGE"' EXIT
export OUT="$STAGE" PYTHONUNBUFFERED=1
END=$(( $(date +%s) + TOTAL ))
KERNEL_S=$(( TOTAL / 4 ))
SKIP="tests bench autotune cpu_tests"
[ "${KERNELS:-probe}" = full ] && SKIP="autotune cpu_tests"
timeout --signal=INT $(( KERNEL_S + 20 )) python scripts/gpu_kernels.py --out "$STAGE" --budget-s "$KERNEL_S" \
  --skip $SKIP 2>&1 | tee "$RETURN/kernels.log"
LEFT=$(( END - $(date +%s) - 15 ))
bash scripts/gpu_session.sh "$LEFT" 2>&1 | tee "$RETURN/session.log"
tar czf "$RETURN/gpu_out.tar.gz.tmp" -C "$STAGE" . && mv "$RETURN/gpu_out.tar.gz.tmp" "$RETURN/gpu_out.tar.gz"
echo "gpu lease: packed $(du -sh "$RETURN/gpu_out.tar.gz" | cut -f1) into gpu_out.tar.gz"
