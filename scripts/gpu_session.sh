#!/usr/bin/env bash
# One lent GPU's work, in the order the open results need it, within one device command (≤ 600 s):
#
#   scripts/gpu_session.sh [SECONDS]
#
# Runs the prepared GPU scripts one after another until SECONDS (default 520) have passed, each given the time
# left: seeds 9-16 of the `unstable` scale's setting, whose FP32 blew up on a CPU (scripts/gpu_moreseeds.sh), the
# activation and normalization ablations as rates at the `unstable` scale (scripts/gpu_ablations.sh),
# the Fig. 7 replica ensemble (scripts/gpu_fig7.sh), then the paper's setting at seeds 1-4
# (scripts/gpu_seeds.sh), then the search for a cheaper unstable setting (scripts/gpu_search.sh). Each is
# resumable in its own WORK folder under /tmp and copies what it finished into $OUT (else into the repository);
# a unit cut short is lost with the machine, so the time goes to one job at a time rather than split. A second
# call on the same (still warm) machine resumes where the first stopped; commit what comes back. The Fig. 7 replica
# gets $FIG7_OPTIONS (default: `--arms adam_eps=1e-15 train_ln_bias`, the two mechanism arms appended after the
# spec's: Adam's epsilon, and the authors' computation with its LN bias trained), the search $SEARCH_OPTIONS
# (default none; e.g. `--settings w256-d4-lr0.003 ...`, the settings another machine is not training).
# $GPU_JOBS names the jobs and their order (default `moreseeds ablations fig7 seeds search`), e.g. GPU_JOBS=search where
# the others have what they need.
set -uo pipefail
cd "$(dirname "$0")/.."
END=$(( $(date +%s) + ${1:-520} ))
JOBS="${GPU_JOBS-moreseeds ablations fig7 seeds search}"
for name in $JOBS; do
  case "$name" in
    moreseeds|ablations|fig7|seeds|search) ;;
    *) echo "gpu session: GPU_JOBS names '$name'; valid jobs: moreseeds ablations fig7 seeds search" >&2; exit 2 ;;
  esac
done
for name in $JOBS; do
  set -- "gpu_$name.sh" "/tmp/proxy-$name"
  LEFT=$(( END - $(date +%s) ))
  if [ "$LEFT" -lt 30 ]; then
    echo "gpu session: $1 not started ($LEFT s left)"
    continue
  fi
  if [ "$1" = gpu_fig7.sh ]; then
    bash "scripts/$1" "$LEFT" "$2" ${FIG7_OPTIONS---arms adam_eps=1e-15 train_ln_bias}
  elif [ "$1" = gpu_search.sh ]; then
    bash "scripts/$1" "$LEFT" "$2" ${SEARCH_OPTIONS-}
  else
    bash "scripts/$1" "$LEFT" "$2"
  fi
done
