#!/usr/bin/env bash
# Local deployment smoke run: one SuperLink and 4 SuperNodes (separate processes, as on separate
# machines) on loopback, then 3 rounds of the Flower MNIST app with `flwr run`. Every process is
# stopped by its id at the end, also on failure or Ctrl-C. Exit status 0 iff the run completed.
#
#   bash experiments/flower_mnist/deploy_smoke.sh            # from the repository root
#   taskset -c 1 bash experiments/flower_mnist/deploy_smoke.sh   # pinned to one core
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "${PYTHON:-.venv/bin/python}" -m shuffle_opacus.flower.launch deployment \
    experiments/flower_mnist --nodes 4 --timeout 600 \
    -c "num-nodes=4 rate=1.0 num-server-rounds=3 evaluate-every=1 test-examples=2000" "$@"
