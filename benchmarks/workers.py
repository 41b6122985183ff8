"""Round workers: a contender in another process, or a framework's own loop, one round at a time.

:class:`RoundWorker` runs a command that serves rounds over a pipe (:func:`serve_rounds`,
:func:`next_round`, :func:`answer` on its side); :class:`ThreadedRounds` steps a framework that
runs its own loop of rounds. :mod:`timing` re-exports them for the benchmark scripts.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: Prefix of a worker's answer line on its stdout.
_MARK = "@@timing "

__all__ = ["RoundWorker", "ThreadedRounds", "answer", "next_round", "peak_rss_mib", "serve_rounds"]


class RoundWorker:
    """A contender in another process, driven one round at a time over its stdin and stdout.

    The worker runs :func:`serve_rounds` (or speaks its protocol: read a round index per line
    from stdin, answer ``@@timing {"seconds": ...}``; on ``stop`` answer ``@@timing {...}``
    with its final record and exit). Lines without the mark are passed to stderr. The worker
    inherits this process's pinning and environment unless ``env`` says otherwise. Call it
    with the round index; close it (or use it as a context manager) to get ``final``.
    """

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, *, hello: bool = False
    ) -> None:
        self.argv = list(argv)
        self.final: dict[str, Any] | None = None
        self.hello: dict[str, Any] | None = None
        self._proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=None if env is None else dict(env),
            text=True,
            bufsize=1,
        )
        self.pid: int | None = self._proc.pid
        self._waiting_hello = hello

    def wait_hello(self) -> dict[str, Any] | None:
        """With ``hello=True``: wait for the worker's first record (sent once it is set up).

        Workers can be started together and then waited for, so that their set-up overlaps.
        """
        if self._waiting_hello:
            self._waiting_hello = False
            self.hello = self._answer()
        return self.hello

    def _answer(self) -> dict[str, Any]:
        assert self._proc.stdout is not None, "started with stdout=PIPE"
        for line in self._proc.stdout:
            if line.startswith(_MARK):
                return json.loads(line[len(_MARK) :])
            sys.stderr.write(line)
        code = self._proc.wait()
        raise RuntimeError(f"worker {self.argv[:3]}... exited with status {code} mid-protocol")

    def __call__(self, round_index: int) -> dict[str, Any]:
        self.wait_hello()
        assert self._proc.stdin is not None, "started with stdin=PIPE"
        self._proc.stdin.write(f"{round_index}\n")
        self._proc.stdin.flush()
        return self._answer()

    def close(self) -> dict[str, Any] | None:
        """Stop the worker; return (and keep in ``final``) its final record."""
        if self.pid is None:
            return self.final
        if self._proc.poll() is not None:  # it ended on its own (e.g. after a refusal)
            self.pid = None
            return self.final
        try:
            assert self._proc.stdin is not None, "started with stdin=PIPE"
            self._proc.stdin.write("stop\n")
            self._proc.stdin.flush()
            self.final = self._answer()
        except (BrokenPipeError, RuntimeError):
            self.final = None
        self._proc.wait()
        self.pid = None
        return self.final

    def __enter__(self) -> RoundWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pid is not None and exc[0] is not None:
            self._proc.kill()
            self._proc.wait()
            self.pid = None
            return
        self.close()


class _ClosedError(Exception):
    """Raised at a driver's boundary after :meth:`ThreadedRounds.close`."""


class ThreadedRounds:
    """A contender whose driver runs its own loop of rounds, one round per call.

    ``driver(boundary)`` runs in a thread of this process and must call ``boundary()`` before
    its first round and after every round (a framework's per-round callback, e.g. Flower's
    ``evaluate_fn``). Each call of this object lets the driver run to its next boundary and
    waits for it, so the helper times exactly one round. :meth:`close` lets the driver finish.
    """

    def __init__(self, driver: Callable[[Callable[[], None]], Any]) -> None:
        self._go = threading.Semaphore(0)
        self._done = threading.Semaphore(0)
        self._first = True
        self._closing = False
        self._finished = False
        self._error: BaseException | None = None

        def body() -> None:
            try:
                driver(self._boundary)
            except _ClosedError:
                pass
            except BaseException as err:  # re-raised in the caller's thread
                self._error = err
            finally:
                self._finished = True
                self._done.release()

        self._thread = threading.Thread(target=body, name="threaded-rounds", daemon=True)
        self._thread.start()

    def _boundary(self) -> None:
        if not self._first:
            self._done.release()
        self._first = False
        self._go.acquire()
        if self._closing:
            # Stop a driver that planned more rounds than were asked for.
            raise _ClosedError

    def __call__(self) -> None:
        if self._finished:
            raise RuntimeError("the driver ended before this round") from self._error
        self._go.release()
        self._done.acquire()
        if self._error is not None:
            raise RuntimeError("the driver failed in this round") from self._error

    def close(self, timeout: float = 60.0) -> None:
        """End the driver at its next boundary and wait for its thread."""
        self._closing = True
        self._go.release()
        self._thread.join(timeout)


def answer(record: Mapping[str, Any]) -> None:
    """Send one answer to the parent :class:`RoundWorker` (a round's, or the final record)."""
    sys.stdout.write(_MARK + json.dumps(record) + "\n")
    sys.stdout.flush()


_say = answer


def serve_rounds(
    run_round: Callable[[int], Any],
    final: Callable[[], Mapping[str, Any]] | None = None,
    *,
    hello: Mapping[str, Any] | None = None,
    stdin: Any = None,
) -> None:
    """The worker's side of :class:`RoundWorker`: run the rounds the parent asks for.

    ``run_round(r)`` returns ``None`` (timed here), its own seconds, or a mapping with
    ``"seconds"`` and extras, as a contender of :func:`compare`. ``hello`` is sent first (for
    a parent that started the worker with ``hello=True``). On ``stop`` or end of input,
    ``final()`` (default: the peak RSS) is sent and the function returns.
    """
    stdin = sys.stdin if stdin is None else stdin
    if hello is not None:
        answer(hello)
    for line in stdin:
        text = line.strip()
        if text == "stop":
            break
        start = time.perf_counter()
        out = run_round(int(text))
        took = time.perf_counter() - start
        record = dict(out) if isinstance(out, Mapping) else {}
        if isinstance(out, (int, float)) and not isinstance(out, bool):
            record["seconds"] = float(out)
        if record.get("seconds") is None:
            record["seconds"] = took
        _say(record)
    _say(dict(final()) if final is not None else {"peak_rss_mib": peak_rss_mib()})


def next_round(stdin: Any = None) -> int | None:
    """Block until the parent asks for the next round; ``None`` on ``stop`` or end of input."""
    line = (sys.stdin if stdin is None else stdin).readline().strip()
    return None if line in ("", "stop") else int(line)


def peak_rss_mib() -> float:
    """Peak resident set size of this process in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
