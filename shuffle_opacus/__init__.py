"""shuffle_opacus: shuffle-model differential privacy accounting for PyTorch/Opacus.

``import shuffle_opacus`` registers the Opacus accountants ``shuffle``, ``subsampled_shuffle``
and ``shuffled_checkin`` (at once if Opacus is already imported, otherwise as soon as it is), so
that ``PrivacyEngine(accountant="shuffled_checkin")`` works. The package itself does not import
torch, so the maths of :mod:`shuffle_opacus.analysis` and the ``shuffle-opacus account`` command
stay light; the names below are imported on first use:

* :func:`make_private`, :func:`make_private_with_epsilon`, :class:`PrivacyOptions`
  (:mod:`.engine.privacy`), the samplers :class:`ShuffledCheckInSampler` and
  :class:`FixedSizeShuffledSampler` (:mod:`.engine.sampling`), :class:`LocalNoiseDPOptimizer`
  (:mod:`.engine.noise`) and the accountant classes (:mod:`.engine.accountants`);
* user level: :func:`make_private_clients`, :class:`ClientPartition`, :func:`iid_partition`,
  :func:`dirichlet_partition`, :func:`shard_partition` (:mod:`.federated`);
* without torch: :func:`history_epsilon` (:mod:`.accounting.history`), :func:`calibrate`,
  :func:`calibrate_noise_multiplier` (:mod:`.accounting.calibration`) and the protocol table
  :data:`PROTOCOLS` (:mod:`.accounting.protocols`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .common import moved
from .common.lazy import lazy_exports
from .engine import registration as _registration

if TYPE_CHECKING:  # the names below, for type checkers; at run time they load on first use
    from .accounting.calibration import Calibration, calibrate, calibrate_noise_multiplier
    from .accounting.history import history_epsilon
    from .accounting.protocols import PROTOCOLS, Protocol, analysis_sigma, get_protocol
    from .engine.accountants import (
        ShuffleAccountant,
        ShuffledCheckInAccountant,
        SubsampledShuffleAccountant,
    )
    from .engine.noise import LocalNoiseDPOptimizer
    from .engine.privacy import PrivacyOptions, make_private, make_private_with_epsilon
    from .engine.sampling import FixedSizeShuffledSampler, ShuffledCheckInSampler
    from .federated import (
        ClientPartition,
        dirichlet_partition,
        iid_partition,
        make_private_clients,
        shard_partition,
    )

from .common.version import __version__

_LAZY: dict[str, str] = {
    "calibrate_noise_multiplier": ".accounting.calibration",
    "calibrate": ".accounting.calibration",
    "Calibration": ".accounting.calibration",
    "history_epsilon": ".accounting.history",
    "PROTOCOLS": ".accounting.protocols",
    "Protocol": ".accounting.protocols",
    "analysis_sigma": ".accounting.protocols",
    "get_protocol": ".accounting.protocols",
    "make_private": ".engine.privacy",
    "make_private_with_epsilon": ".engine.privacy",
    "PrivacyOptions": ".engine.privacy",
    "ShuffledCheckInSampler": ".engine.sampling",
    "FixedSizeShuffledSampler": ".engine.sampling",
    "LocalNoiseDPOptimizer": ".engine.noise",
    "make_private_clients": ".federated",
    "ClientPartition": ".federated",
    "iid_partition": ".federated",
    "dirichlet_partition": ".federated",
    "shard_partition": ".federated",
    "ShuffleAccountant": ".engine.accountants",
    "SubsampledShuffleAccountant": ".engine.accountants",
    "ShuffledCheckInAccountant": ".engine.accountants",
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
moved.install()  # the modules' names before the layer folders, for one release
