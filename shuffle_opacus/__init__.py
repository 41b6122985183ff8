"""shuffle_opacus: shuffle-model differential privacy accounting for PyTorch/Opacus.

``import shuffle_opacus`` registers the Opacus accountants ``shuffle``, ``subsampled_shuffle``
and ``shuffled_checkin`` (at once if Opacus is already imported, otherwise as soon as it is), so
that ``PrivacyEngine(accountant="shuffled_checkin")`` works. The package itself does not import
torch, so the maths of :mod:`shuffle_opacus.analysis` and the ``shuffle-opacus account`` command
stay light; the names below are imported on first use:

* :func:`make_private`, :func:`make_private_with_epsilon`, :class:`PrivacyOptions`
  (:mod:`.privacy`), the samplers :class:`ShuffledCheckInSampler` and
  :class:`FixedSizeShuffledSampler` (:mod:`.sampling`), :class:`LocalNoiseDPOptimizer`
  (:mod:`.noise`) and the accountant classes (:mod:`.accountants`);
* user level: :func:`make_private_clients`, :class:`ClientPartition`, :func:`iid_partition`,
  :func:`dirichlet_partition`, :func:`shard_partition` (:mod:`.clients`);
* without torch: :func:`history_epsilon` (:mod:`.history`), :func:`calibrate`,
  :func:`calibrate_noise_multiplier` (:mod:`.calibration`) and the protocol table
  :data:`PROTOCOLS` (:mod:`.protocols`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _registration
from ._lazy import lazy_exports

if TYPE_CHECKING:  # the names below, for type checkers; at run time they load on first use
    from .accountants import (
        ShuffleAccountant,
        ShuffledCheckInAccountant,
        SubsampledShuffleAccountant,
    )
    from .calibration import Calibration, calibrate, calibrate_noise_multiplier
    from .clients import (
        ClientPartition,
        dirichlet_partition,
        iid_partition,
        make_private_clients,
        shard_partition,
    )
    from .history import history_epsilon
    from .noise import LocalNoiseDPOptimizer
    from .privacy import PrivacyOptions, make_private, make_private_with_epsilon
    from .protocols import PROTOCOLS, Protocol, analysis_sigma, get_protocol
    from .sampling import FixedSizeShuffledSampler, ShuffledCheckInSampler

from ._version import __version__

_LAZY: dict[str, str] = {
    "calibrate_noise_multiplier": ".calibration",
    "calibrate": ".calibration",
    "Calibration": ".calibration",
    "history_epsilon": ".history",
    "PROTOCOLS": ".protocols",
    "Protocol": ".protocols",
    "analysis_sigma": ".protocols",
    "get_protocol": ".protocols",
    "make_private": ".privacy",
    "make_private_with_epsilon": ".privacy",
    "PrivacyOptions": ".privacy",
    "ShuffledCheckInSampler": ".sampling",
    "FixedSizeShuffledSampler": ".sampling",
    "LocalNoiseDPOptimizer": ".noise",
    "make_private_clients": ".clients",
    "ClientPartition": ".clients",
    "iid_partition": ".clients",
    "dirichlet_partition": ".clients",
    "shard_partition": ".clients",
    "ShuffleAccountant": ".accountants",
    "SubsampledShuffleAccountant": ".accountants",
    "ShuffledCheckInAccountant": ".accountants",
}

__all__ = [
    "__version__",
    "ClientPartition",
    "dirichlet_partition",
    "iid_partition",
    "make_private_clients",
    "shard_partition",
    "FixedSizeShuffledSampler",
    "LocalNoiseDPOptimizer",
    "PROTOCOLS",
    "PrivacyOptions",
    "Protocol",
    "ShuffleAccountant",
    "ShuffledCheckInAccountant",
    "ShuffledCheckInSampler",
    "SubsampledShuffleAccountant",
    "analysis_sigma",
    "calibrate_noise_multiplier",
    "calibrate",
    "Calibration",
    "get_protocol",
    "history_epsilon",
    "make_private",
    "make_private_with_epsilon",
]


# PEP 562: each public name is imported from its module on first use.
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())


_registration.install()
