#!/usr/bin/env bash
# One lent GPU's work, in the order the open results need it, within one device command (≤ 600 s):
#
#   scripts/gpu_session.sh [SECONDS]
#
# Splits SECONDS (default 520) between the prepared GPU scripts: the Fig. 7 replica ensemble
# (scripts/gpu_fig7.sh, half), the paper's setting at seeds 1-4 (scripts/gpu_seeds.sh, three tenths) and the
# search for a cheaper unstable setting (scripts/gpu_search.sh, the rest), each resumable in its own WORK folder
# under /tmp, each copying what it finished into $OUT (else into the repository). A second call on the same
# (still warm) machine resumes all three; commit what comes back.
set -uo pipefail
cd "$(dirname "$0")/.."
TOTAL="${1:-520}"
bash scripts/gpu_fig7.sh $(( TOTAL * 5 / 10 )) /tmp/proxy-fig7
bash scripts/gpu_seeds.sh $(( TOTAL * 3 / 10 )) /tmp/proxy-seeds
bash scripts/gpu_search.sh $(( TOTAL * 2 / 10 )) /tmp/proxy-search
