#!/usr/bin/env bash
# The held-out fairness report out of core, against the fit it evaluates: peak memory of
# the process tree (benchmarks/peak_rss.py) and wall time of `dfairpca fit` on a training
# store and of `dfairpca evaluate` on a larger held-out store of CelebA's image size.
#
#     bash benchmarks/bench_evaluate.sh WORKDIR [N_TRAIN] [N_TEST] [K]
set -euo pipefail
work=${1:?WORKDIR}; n_train=${2:-20000}; n_test=${3:-60000}; k=${4:-100}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work"
[ -d "$work/train.zarr" ] || dfairpca synth-celeba "$work/train.zarr" --n "$n_train" --seed 0
[ -d "$work/test.zarr" ] || dfairpca synth-celeba "$work/test.zarr" --n "$n_test" --seed 1
python "$here/peak_rss.py" dfairpca fit "$work/train.zarr" --attribute Eyeglasses -k "$k" \
    --out "$work/fair" --overwrite
python "$here/peak_rss.py" dfairpca evaluate "$work/fair" "$work/test.zarr" \
    --attribute Eyeglasses --attribute Male
python "$here/peak_rss.py" dfairpca evaluate "$work/fair" "$work/test.zarr" \
    --attribute Eyeglasses --attribute Male --baseline-k "$k" --json
