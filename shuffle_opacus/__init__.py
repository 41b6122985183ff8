"""shuffle_opacus: shuffle-model differential privacy accounting for PyTorch/Opacus.

The maths lives in :mod:`shuffle_opacus.analysis` (numpy/scipy only); importing this package
does not import torch.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
