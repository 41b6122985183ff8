"""Stop requests: a signal becomes a request honoured between rounds."""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["StopRequest"]


class StopRequest:
    """Turn Ctrl-C (SIGINT) into a request honoured between rounds.

    A round interrupted half-way could leave the model stepped but the round not recorded, and a
    checkpoint of that state would not resume exactly. So the first Ctrl-C only sets a flag: the
    current round finishes, a checkpoint is written and the run stops. A second Ctrl-C raises
    ``KeyboardInterrupt`` at once; the last periodic checkpoint is then the resume point. Only
    installed in the main thread, and not when SIGINT is ignored (background jobs).
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if previous is not signal.SIG_IGN:
                self._previous = previous
                signal.signal(signal.SIGINT, self._handle)
                self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
