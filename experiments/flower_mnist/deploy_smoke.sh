#!/usr/bin/env bash
# Local deployment smoke run: one SuperLink and 4 SuperNodes (separate processes, as on separate
# machines) on loopback, then 3 rounds of the Flower MNIST app with `flwr run`. Every process is
# stopped by its id at the end, also on failure or Ctrl-C. Exit status 0 iff the run completed.
#
#   bash experiments/flower_mnist/deploy_smoke.sh            # from the repository root
#   taskset -c 1 bash experiments/flower_mnist/deploy_smoke.sh   # pinned to one core
#   MODE=secagg ROUNDS=1 bash experiments/flower_mnist/deploy_smoke.sh   # SecAgg+, 1 round
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
MODE="${MODE:-trusted-server}"
ROUNDS="${ROUNDS:-3}"
case "$MODE" in trusted-server|secagg) ;; *) echo "MODE must be trusted-server or secagg. Found '$MODE'." >&2; exit 2 ;; esac
case "$ROUNDS" in ''|*[!0-9]*|0) echo "ROUNDS must be an integer >= 1. Found '$ROUNDS'." >&2; exit 2 ;; esac
exec "${PYTHON:-.venv/bin/python}" -m shuffle_opacus.flower.launch deployment \
    experiments/flower_mnist --nodes 4 --timeout 600 \
    -c "mode='$MODE' num-nodes=4 rate=1.0 num-server-rounds=$ROUNDS evaluate-every=1 test-examples=2000" "$@"
