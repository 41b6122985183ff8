"""Opacus training in the shuffle model: accountants, samplers, the private loader and local noise.

Importing this package imports nothing; its modules import torch and Opacus. The public names
are re-exported by :mod:`shuffle_opacus` (``make_private``, the samplers, the accountants).
"""
