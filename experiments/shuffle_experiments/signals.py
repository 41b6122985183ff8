"""Stop requests: SIGTERM and Ctrl-C become a request honoured between rounds.

A round interrupted half-way could leave the model stepped but the round not recorded, and a
checkpoint of that state would not resume exactly. So the first SIGTERM (what a cluster sends at
pre-emption or at its time limit) or Ctrl-C (SIGINT) only sets a flag: the round under way
finishes, a checkpoint is written, the run says how to resume and stops. A second signal stops
at once (``KeyboardInterrupt``); the last checkpoint is then the resume point. The handlers are
installed in the main thread only. A process that inherited an ignored SIGINT (started in the
background by a shell) keeps ignoring it, and :attr:`StopRequest.sigint_ignored` says so, so
that the run can tell its user to stop it with ``kill -TERM``.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["StopRequest"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """Turn SIGTERM and SIGINT into a request honoured between rounds (a context manager).

    Attributes:
        requested: Whether a stop was requested.
        signal_name: ``"SIGTERM"`` or ``"SIGINT"`` once one was received.
        sigint_ignored: Whether SIGINT was ignored when the run started (a background job):
            Ctrl-C then does nothing and SIGTERM is the way to stop.
    """

    def __init__(self) -> None:
        """Create a request that is not installed yet."""
        self.requested = False
        self.signal_name: str | None = None
        self.sigint_ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = signal.Signals(signum).name

    def __enter__(self) -> StopRequest:
        """Install the handlers (main thread only; an ignored SIGINT stays ignored)."""
        if threading.current_thread() is threading.main_thread():
            for signum in _SIGNALS:
                previous = signal.getsignal(signum)
                if previous is signal.SIG_IGN:
                    continue
                self._previous[signum] = previous
                signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        """Restore the previous handlers."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
