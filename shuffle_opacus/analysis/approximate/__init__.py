"""Approximate-DP baselines: the clones method, composition theorems, the analytic Gaussian."""
