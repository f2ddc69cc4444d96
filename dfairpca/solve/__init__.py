"""The solves from statistics: exact and randomized, the fairness constraints and
certificate, kernels."""
