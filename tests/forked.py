"""Scenarios that each need a fresh interpreter, run as forked children of one.

A test about what a fresh interpreter imports (the import order of a registration, the modules a
command loads) needs a process per scenario, and most of such a process's time goes to start-up
and to imports that every scenario shares and that the test is not about. :class:`Forked` starts
one fresh interpreter that runs a common ``preamble`` once (the shared imports, and the checks that
they loaded nothing the scenarios are about), then forks a child per scenario, all at once; each
child runs its scenario's code as a fresh ``__main__``, so that its ``sys.modules`` is a fresh
interpreter's plus the preamble's, and reports its exit status, stdout and stderr.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass

#: Runs the preamble of its first argument, then each scenario of the JSON object in its second
#: argument in a forked child, all at once; prints a JSON object: scenario -> [exit status,
#: stdout, stderr]. A scenario that raises (``SystemExit`` included) exits 1 with its traceback
#: on stderr.
_DRIVER = textwrap.dedent(
    """
    import json, os, sys, tempfile, traceback
    exec(compile(sys.argv[1], "<preamble>", "exec"), {"__name__": "__preamble__"})
    scripts = json.loads(sys.argv[2])
    sys.stdout.flush()
    sys.stderr.flush()
    children = {}
    for name, code in scripts.items():
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout = os.fdopen(1, "w", closefd=False)
                sys.stderr = os.fdopen(2, "w", closefd=False)
                exec(compile(code, f"<scenario {name}>", "exec"), {"__name__": "__main__"})
                status = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        children[name] = (pid, out, err)
    results = {}
    for name, (pid, out, err) in children.items():
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        results[name] = [os.waitstatus_to_exitcode(status), out.read(), err.read()]
    print(json.dumps(results))
    """
)


@dataclass(frozen=True)
class Outcome:
    """How one scenario ended: its exit status (1 when it raised), stdout and stderr."""

    status: int
    stdout: str
    stderr: str


class Forked:
    """Start the scenarios at once; :meth:`outcome` waits for them and gives one's outcome.

    Args:
        preamble: Code the fresh interpreter runs once before forking (an exception there fails
            every scenario, with the preamble's traceback).
        scripts: Scenario name -> the code its child runs as ``__main__``.
    """

    def __init__(self, preamble: str, scripts: dict[str, str]) -> None:
        self._driver = subprocess.Popen(
            [sys.executable, "-c", _DRIVER, preamble, json.dumps(scripts)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._outcomes: dict[str, Outcome] = {}

    def outcome(self, name: str) -> Outcome:
        """Wait for the scenarios (once) and return ``name``'s outcome.

        Raises:
            AssertionError: if the preamble or the driver failed (with its stderr).
        """
        if not self._outcomes:
            out, err = self._driver.communicate(timeout=300)
            assert self._driver.returncode == 0, (
                f"the driver exited {self._driver.returncode}: {err}"
            )
            self._outcomes = {k: Outcome(*v) for k, v in json.loads(out).items()}
        return self._outcomes[name]

    def close(self) -> None:
        """Stop the driver if its scenarios were never waited for (their tests deselected)."""
        self._driver.kill()
        self._driver.communicate()
