"""The pass: folding chunks into running statistics on numpy, Dask or a cluster;
checkpoints; the randomized fit's thin passes."""
