#!/usr/bin/env bash
# The ingest as a user runs it: `dfairpca ingest-celeba --n-jobs 1` against `--n-jobs 2`,
# each a fresh process (its start and imports inside the time), alternately, ROUNDS rounds.
#
#   bash benchmarks/bench_ingest_cli.sh CELEBA_DIR [ROUNDS] [ingest options, e.g. --size full --color]
#
# CELEBA_DIR: a CelebA download, e.g. the fabricated one `bench_ingest.py --jpegs DIR` keeps.
# Before each run the store is deleted, `sync`ed and the JPEGs read into the page cache.
set -euo pipefail
src=$1; rounds=${2:-3}; shift; shift || true
out=$(mktemp -d)/ingest.zarr
trap 'rm -rf "$(dirname "$out")"' EXIT
for r in $(seq "$rounds"); do
  for j in 1 2; do
    rm -rf "$out"; sync; cat "$src"/img_align_celeba/*.jpg > /dev/null
    s=$(date +%s.%N)
    dfairpca ingest-celeba "$src" "$out" "$@" --n-jobs "$j" > /dev/null 2>&1
    e=$(date +%s.%N)
    echo "round $r n_jobs=$j $(python3 -c "print(f'{$e - $s:.2f}')") s"
  done
done
