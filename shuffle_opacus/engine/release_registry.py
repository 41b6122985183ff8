"""Every round released in this process, per data set and seed, across engines.

An accountant refuses a ``(seed, round)`` pair it has released already, but two engines know
nothing of each other: a notebook cell run twice (same seed, same data) trains two models on the
same check-in sets, and each accountant reports its own run alone. Releasing a round twice with
the same coins and two independent noise draws is one round whose two noisy sums together carry
the signal of one sum at noise ``sigma / sqrt(2)`` (``k`` releases: ``sigma / sqrt(k)``; noise
multipliers ``s_i``: ``(sum s_i**-2) ** -1/2``): for two Gaussian queries on the same subset,
the pair of answers is the single answer of a query of twice the squared sensitivity. So the
models together are worth the composition of both histories with each shared round counted once
at that noise (n = 1, gamma = 0.1, sigma = 5, 50 rounds: 4.930 each, 7.575 together at
delta = 1e-5; counted as 100 independent rounds it would be 6.829, too low).

:data:`REGISTRY` binds each preparation (:func:`shuffle_opacus.make_private`,
:func:`~shuffle_opacus.federated.make_private_clients`) to its data's identity and seed. When a
round is released that another engine in the process released on the same data with the same
seed, a :class:`SharedCoinsWarning` names the earlier engines and gives the epsilon of all of them
together; with ``strict=True`` (on either preparation) the round is refused instead
(:class:`SharedCoinsError`), before anything is released. With the same data and seed but other
sampling (another rate or sample size), the check-ins are drawn from the same coins without
being the same sets: that is warned about (or refused) without an epsilon.

What counts as the same data (:func:`data_identity`): the same object, or a data set of the same
length whose examples at eight fixed positions (first, last and six between; tensors, arrays,
numbers and strings, read through ``dataset[i]``) have the same bytes. A data set whose examples
are random (reading position 0 twice differs) or of other types is the same only as an object.
The user level adds the client partition to the identity.
"""

from __future__ import annotations

import hashlib
import os
import sys
import warnings
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .releases import ReleaseRecord, ReplayError

if TYPE_CHECKING:
    from .releases import ReleasingAccountant

__all__ = [
    "REGISTRY",
    "REPORT_DELTA",
    "Binding",
    "DataIdentity",
    "ReleaseRegistry",
    "SharedCoinsError",
    "SharedCoinsWarning",
    "data_identity",
]

#: The delta at which a warning states the epsilon of the engines together.
REPORT_DELTA = 1e-5

_POSITIONS = 8
# The package folder (engine/ -> shuffle_opacus/), with a separator: frames below it are ours.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class SharedCoinsWarning(UserWarning):
    """Another engine in this process released the same rounds on the same data and seed."""


class SharedCoinsError(ReplayError):
    """As :class:`SharedCoinsWarning`, refused because a preparation asked for ``strict=True``."""


def _digest(value: object, h: Any, depth: int = 0) -> bool:
    """Feed a canonical form of ``value`` to ``h``; False for a type without a fingerprint."""
    torch = sys.modules.get("torch")
    if depth > 8:
        return False
    if torch is not None and isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous().reshape(-1)
        h.update(f"T{value.dtype}{tuple(value.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
        return True
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            return False
        h.update(f"A{value.dtype.str}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
        return True
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        h.update(f"S{type(value).__name__}:{value!r};".encode())
        return True
    if np is not None and isinstance(value, np.generic):
        return _digest(np.asarray(value), h, depth + 1)
    if isinstance(value, (tuple, list)):
        h.update(f"L{len(value)}(".encode())
        return all(_digest(v, h, depth + 1) for v in value)
    return False


@dataclass(frozen=True)
class DataIdentity:
    """What makes two data sets "the same data" (see the module docstring).

    Attributes:
        length: Number of examples (or clients, with a partition).
        fingerprint: Digest of the examples at fixed positions, or ``None`` if they cannot be
            fingerprinted (then only the object itself identifies the data).
        ref: Weak reference to the data object, or ``None`` if it takes none.
    """

    length: int
    fingerprint: str | None
    ref: Any = field(default=None, compare=False, repr=False)

    def same(self, other: DataIdentity) -> bool:
        """Return whether ``other`` identifies the same data.

        Args:
            other: Another identity.

        Returns:
            True for the same live object, or the same length and fingerprint.
        """
        if self.ref is not None and other.ref is not None:
            mine, theirs = self.ref(), other.ref()
            if mine is not None and mine is theirs:
                return True
        return (
            self.fingerprint is not None
            and self.fingerprint == other.fingerprint
            and self.length == other.length
        )


def data_identity(
    data: Any, *, length: int | None = None, extra: bytes = b"", rows: Any = None
) -> DataIdentity:
    """Return the identity of a map-style data set (see the module docstring).

    Reads at most nine examples; a read that raises leaves the data identified by the object.

    Args:
        data: The data set (``len`` and ``data[i]``), or a sequence of rows.
        length: Its length, if known (``len(data)`` otherwise).
        extra: Bytes that are part of the identity (the user level's client partition).
        rows: Where to read the examples, if not ``data`` itself (``rows[i]``, ``len(rows)``).

    Returns:
        The identity.
    """
    n = len(data) if length is None else int(length)
    source = data if rows is None else rows
    count = len(source)
    try:
        ref: Any = weakref.ref(data)
    except TypeError:
        ref = None
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{n}:".encode() + extra)
    positions = sorted({round(k * (count - 1) / (_POSITIONS - 1)) for k in range(_POSITIONS)})
    try:
        once, twice = hashlib.blake2b(digest_size=16), hashlib.blake2b(digest_size=16)
        # Example 0 read twice must agree: random examples (augmentation) have no fingerprint.
        usable = count > 0 and _digest(source[0], once) and _digest(source[0], twice)
        usable = usable and once.digest() == twice.digest()
        usable = usable and all(_digest(source[i], h) for i in positions)
    except Exception:  # noqa: BLE001 - an unreadable example only costs the fingerprint
        usable = False
    return DataIdentity(length=n, fingerprint=h.hexdigest() if usable else None, ref=ref)


def _outside() -> tuple[str, int]:
    """Return ``(file:line, stacklevel)`` of the first caller outside the package."""
    frame: Any = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    if frame is None:
        return "an unknown place", 1
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}", level


def caller() -> str:
    """Return ``file:line`` of the first caller outside the package (for messages)."""
    return _outside()[0]


@dataclass(eq=False)
class Binding:
    """One preparation: an accountant releasing one seed's rounds on one data set.

    Attributes:
        number: Its number in this process (``engine #number`` in messages).
        where: Where it was prepared (``make_private at file:line``).
        accountant: The accountant that records its rounds.
        data: The data's identity.
        seed: The sampler's seed.
        sampling: ``(protocol, n, rate)``: what makes two seeds' rounds the same sets.
        config: The accountant's ``(sensitivity, sample_size, method)`` for the run.
        noise_multiplier: Its local noise multiplier.
        strict: Whether a shared round is refused rather than warned about.
        rounds: The rounds it released in this process.
        warned: Numbers of the engines already named in a warning to it.
    """

    number: int
    where: str
    accountant: ReleasingAccountant
    data: DataIdentity
    seed: int
    sampling: tuple[str, int, float]
    config: tuple[float, int | None, str | None]
    noise_multiplier: float
    strict: bool
    rounds: ReleaseRecord = field(default_factory=ReleaseRecord)
    warned: set[int] = field(default_factory=set)

    @property
    def label(self) -> str:
        """``engine #k (make_private at file:line)``."""
        return f"engine #{self.number} ({self.where})"


def _segments(bindings: list[Binding], plan: tuple[Binding, int, int]) -> list[Any]:
    """Return ``(length, [bindings])`` for each stretch of rounds held by the same bindings."""
    spans = [(b, a, z) for b in bindings for _, a, z in b.rounds.state()]
    spans.append(plan)
    cuts = sorted({x for _, a, z in spans for x in (a, z)})
    out = []
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        holders = list({id(b): b for b, a, z in spans if a <= lo and hi <= z}.values())
        if len(holders) > 1:
            out.append((hi - lo, holders))
    return out


def _remove(history: list[tuple[float, float, int]], nm: float, rate: float, k: int) -> int:
    """Take up to ``k`` steps of ``(nm, rate)`` out of ``history``; return how many were taken."""
    taken = 0
    for i in range(len(history) - 1, -1, -1):
        s, r, steps = history[i]
        if s == nm and r == rate and taken < k:
            use = min(steps, k - taken)
            history[i] = (s, rate, steps - use)
            taken += use
    return taken


def _together(group: list[Binding], shared: list[Any], extra: dict[int, int]) -> float | str:
    """Epsilon at :data:`REPORT_DELTA` of the group's histories, shared rounds counted once.

    Returns:
        The epsilon, or the reason it cannot be computed.
    """
    last = group[-1]
    if any((b.config, type(b.accountant)) != (last.config, type(last.accountant)) for b in group):
        return "the engines' accountants are configured differently"
    rate = float(last.sampling[2])
    histories = {
        b.number: [*b.accountant.history, (b.noise_multiplier, rate, extra.get(b.number, 0))]
        for b in group
    }
    merged: list[tuple[float, float, int]] = []
    for length, holders in shared:
        for b in holders:
            # Steps not found in a history stay in it: more rounds, an upper bound.
            _remove(histories[b.number], b.noise_multiplier, rate, length)
        sigma = sum(b.noise_multiplier**-2 for b in holders) ** -0.5
        merged.append((sigma, rate, length))
    sensitivity, sample_size, method = last.config
    joint = type(last.accountant)()
    try:
        joint.configure(
            population=last.sampling[1],
            sensitivity=sensitivity,
            method=method,
            sample_size=sample_size,
        )
        joint.history = [e for h in histories.values() for e in h if e[2] > 0] + merged
        return float(joint.get_epsilon(REPORT_DELTA))
    except ValueError as exc:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


class ReleaseRegistry:
    """The process-wide record of :class:`Binding` s (one instance: :data:`REGISTRY`)."""

    def __init__(self) -> None:
        """Create an empty registry."""
        self.bindings: list[Binding] = []
        self._count = 0

    def clear(self) -> None:
        """Forget every binding (tests; a new process starts empty anyway)."""
        self.bindings.clear()
        self._count = 0

    def new_binding(
        self,
        accountant: ReleasingAccountant,
        data: DataIdentity,
        *,
        seed: int,
        sampling: tuple[str, int, float],
        config: tuple[float, int | None, str | None],
        noise_multiplier: float,
        strict: bool,
        where: str,
    ) -> Binding:
        """Return a binding for a preparation; it is not registered until :meth:`add`.

        Args:
            accountant: The engine's accountant.
            data: The data's identity (:func:`data_identity`).
            seed: The sampler's seed.
            sampling: ``(protocol, n, sample rate)``.
            config: The accountant's ``(sensitivity, sample_size, method)`` for the run.
            noise_multiplier: The local noise multiplier.
            strict: Refuse shared rounds instead of warning.
            where: Where it is prepared, for messages.

        Returns:
            The binding.
        """
        return Binding(
            self._count + 1,
            where,
            accountant,
            data,
            seed,
            sampling,
            config,
            noise_multiplier,
            strict,
        )

    def add(self, binding: Binding) -> None:
        """Register ``binding``: from now on its releases are compared with the others'.

        Args:
            binding: From :meth:`new_binding`.
        """
        self._count = max(self._count, binding.number)
        self.bindings.append(binding)

    def _peers(self, binding: Binding) -> list[Binding]:
        return [
            b
            for b in self.bindings
            if b is not binding
            and b.accountant is not binding.accountant
            and b.seed == binding.seed
            and b.data.same(binding.data)
        ]

    def check(self, binding: Binding, start: int, stop: int) -> None:
        """Warn about, or refuse, releasing rounds ``[start, stop)`` through ``binding``.

        Called with a preparation's plan (before anything changes) and before each round.

        Args:
            binding: The releasing binding (registered or not).
            start: First round.
            stop: One past the last.

        Raises:
            SharedCoinsError: if another engine released one of the rounds on the same data
                with the same seed and either preparation asked for ``strict=True``.
        """
        candidates = self._peers(binding)
        held = {id(b): b.rounds.first_released(b.seed, start, stop) for b in candidates}
        peers = [b for b in candidates if held[id(b)] is not None]
        if not peers:
            return
        strict = binding.strict or any(b.strict for b in peers)
        if not strict and all(b.number in binding.warned for b in peers):
            return  # named once already; the epsilon is not recomputed every round
        same = [b for b in peers if b.sampling == binding.sampling]
        other = [b for b in peers if b.sampling != binding.sampling]
        first = min(int(held[id(b)]) for b in peers)  # type: ignore[arg-type]
        names = ", ".join(b.label for b in peers)
        head = (
            f"{binding.label} releases round {first} of seed {binding.seed} on the same data as "
            f"{names}, which released it already"
        )
        if other:
            body = (
                "with other sampling: the check-ins come from the same coins, so the runs are "
                "not independent and no epsilon of them together is computed"
            )
        else:
            group = [*same, binding]
            plan = (binding, start, stop)
            eps = _together(group, _segments(group, plan), {binding.number: stop - start})
            if isinstance(eps, float):
                body = (
                    f"(the same check-ins): the models together are worth epsilon {eps:.3f} at "
                    f"delta {REPORT_DELTA:g}, more than either reports"
                )
            else:
                body = f"(the same check-ins); the epsilon of the models together: {eps}"
        if strict:
            raise SharedCoinsError(
                f"{head} {body}; refused (strict=True). Use another seed (seed=None draws fresh "
                f"coins)."
            )
        binding.warned.update(b.number for b in peers)
        warnings.warn(
            f"{head} {body}. Use another seed (seed=None draws fresh coins), or strict=True to "
            f"refuse.",
            SharedCoinsWarning,
            stacklevel=_outside()[1],
        )

    def binding_for(self, accountant: ReleasingAccountant, seed: int) -> Binding | None:
        """Return the latest binding of ``accountant`` and ``seed``, or ``None``.

        Args:
            accountant: An accountant.
            seed: A seed.

        Returns:
            The binding.
        """
        for b in reversed(self.bindings):
            if b.accountant is accountant and b.seed == seed:
                return b
        return None

    def released(self, binding: Binding, t: int) -> None:
        """Record that ``binding`` released round ``t`` (after its accountant recorded it).

        Args:
            binding: The binding.
            t: The round.
        """
        if binding.rounds.first_released(binding.seed, t, t + 1) is None:
            binding.rounds.add(binding.seed, t)


#: The registry of this process.
REGISTRY = ReleaseRegistry()
