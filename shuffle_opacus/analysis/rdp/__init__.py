"""Rényi DP of the shuffle Gaussian and its variants, central references, RDP to (eps, delta)."""
