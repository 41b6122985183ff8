"""The secure-aggregation mode on Flower's SecAgg+: parameters, node, client mod and strategy.

:mod:`.parameters` derives SecAgg+'s set-up from C, σ, n, D and the model size; :mod:`.node`
and :mod:`.mod` are a node's side, :mod:`.strategy`, :mod:`.workflow` and :mod:`.decode` the
server's. The public names are :mod:`shuffle_opacus.flower`'s.
"""
