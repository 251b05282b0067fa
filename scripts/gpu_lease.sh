#!/usr/bin/env bash
# Everything one lent GPU does in one device command, packed so that it comes back:
#
#   scripts/gpu_lease.sh [SECONDS]        # e.g. run(command="bash scripts/gpu_lease.sh 560", timeout_s=600)
#
# The device tool returns at most 8 files from $OUT, no more than two folders down, so the exports the GPU
# scripts write under $OUT/results/plan/STUDY/MEMBER/ would not come back as they are. This runs
# scripts/gpu_session.sh (its first slot the kernel check, by $KERNELS: probe, the default, full, none or mosaic; then
# the plan's GPU queue) with $OUT pointed at a staging folder, and packs that folder into $OUT/gpu_out.tar.gz with the
# two logs (kernels.log, session.log) beside it; an archive over 15 MiB ($PART_BYTES) is split into pieces
# gpu_out.tar.gz.part0, part1, ..., since no file over 16 MiB comes back. Unpack it in the repository root (`tar xzf
# gpu_out.tar.gz`, or `cat gpu_out.tar.gz.part* | tar xz`): its paths are the repository's (results/..., plus
# gpu_kernels.log, gemm_tuning.json and mosaic_gemm.json at its top).
set -uo pipefail
cd "$(dirname "$0")/.."
TOTAL="${1:-560}"
RETURN="${OUT:?scripts/gpu_lease.sh needs OUT, the device machine output folder}"
STAGE="$(mktemp -d /tmp/gpu-lease.XXXXXX)"
trap 'rm -rf "$STAGE" "$STAGE.tar.gz"' EXIT
PART_BYTES="${PART_BYTES:-15728640}"  # 15 MiB: the device tool returns files of at most 16 MiB
export OUT="$STAGE" PYTHONUNBUFFERED=1
END=$(( $(date +%s) + TOTAL ))
case "${KERNELS:-probe}" in
  probe|full|none|mosaic) ;;
  *) echo "gpu lease: KERNELS='$KERNELS'; valid: probe (default), full, none, mosaic" >&2; exit 2 ;;
esac
LEFT=$(( END - $(date +%s) - 5 ))  # packing takes seconds; the device command's own limit gives more
KERNELS_LOG="$RETURN/kernels.log" bash scripts/gpu_session.sh "$LEFT" 2>&1 | tee "$RETURN/session.log"
tar czf "$STAGE.tar.gz" -C "$STAGE" . || exit 1
if [ "$(stat -c %s "$STAGE.tar.gz")" -le "$PART_BYTES" ]; then
  mv "$STAGE.tar.gz" "$RETURN/gpu_out.tar.gz"
  echo "gpu lease: packed $(du -sh "$RETURN/gpu_out.tar.gz" | cut -f1) into gpu_out.tar.gz"
else  # a file over the device tool's 16 MiB does not come back: pieces of PART_BYTES, joined again by cat
  split -b "$PART_BYTES" -d -a 1 "$STAGE.tar.gz" "$RETURN/gpu_out.tar.gz.part" && rm "$STAGE.tar.gz"
  PARTS=$(ls "$RETURN" | grep -c '^gpu_out.tar.gz.part')
  echo "gpu lease: packed $(du -shc "$RETURN"/gpu_out.tar.gz.part* | tail -1 | cut -f1) into $PARTS pieces," \
    "gpu_out.tar.gz.part0...; join them with: cat gpu_out.tar.gz.part* | tar xz"
  if [ "$PARTS" -gt 6 ]; then
    echo "gpu lease: $PARTS pieces; the device tool returns 8 files, 64 MiB in all" >&2
  fi
fi
