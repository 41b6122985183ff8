"""Run a Flower app on this machine with ``flwr run``, and stop every process started for it.

:class:`LocalFederation` starts one SuperLink on loopback, either with Flower's simulation
engine (``--simulation``: Ray runs the ClientApps of ``num_nodes`` virtual nodes) or with
``num_nodes`` SuperNode processes (the deployment engine, as on real machines), submits runs
with ``flwr run … --stream`` and reads each run's final status with ``flwr list`` (``flwr run``
exits with 0 even when the run failed). It uses a private ``FLWR_HOME``, switches off telemetry
and update checks, and always starts the SuperLink with
``--disable-runtime-dependency-installation``, so the apps import from this environment and
nothing is downloaded.

Cleanup is by process id. Every process started here carries a marker in its environment,
which Flower's and Ray's subprocesses inherit; on exit :class:`LocalFederation` collects the
marked processes and the descendants of the ones it started, sends them ``SIGTERM`` (SuperNodes
first), waits, sends ``SIGKILL`` to any survivor, and raises if one is still alive.

Command line (the app's ``[tool.flwr.app.config]`` keys can be overridden with ``-c``)::

    python -m shuffle_opacus.flower.launch simulation APP_DIR --nodes 20
    python -m shuffle_opacus.flower.launch deployment APP_DIR --nodes 4 -c "num-rounds=3"

``--nodes`` sets the app's ``num-nodes`` (a different ``-c num-nodes`` is refused before anything
starts), the console gets one line per round (reports, epsilon, accuracy when evaluated) while
the run goes, and the full log is ``WORK_DIR/logs/run-<run id>.log``. Flower 1.41's own local
SuperLink for ``flwr run`` serves interactive use; this launcher keeps by hand what tests and CI
need beyond it: a private ``FLWR_HOME``, both engines, and every process stopped by id.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from ..analysis._validation import check_int, check_positive

__all__ = ["ENGINES", "LocalFederation", "RoundPrinter", "RunOutcome", "main", "toml_overrides"]

ENGINES: tuple[str, ...] = ("simulation", "deployment")
_MARKER = "SHUFFLE_OPACUS_FLOWER_LAUNCH"
_CONNECTION = "local"


@dataclass(frozen=True)
class RunOutcome:
    """One ``flwr run`` of :meth:`LocalFederation.run`.

    Attributes:
        run_id: The run's id (``None`` if the run was not started).
        status: Flower's final status, ``finished:completed`` on success.
        seconds: Wall time of ``flwr run --stream`` (submission to end of the run).
        log_path: File holding the streamed log of the run (ServerApp and, in simulation, the
            ClientApps).
    """

    run_id: int | None
    status: str
    seconds: float
    log_path: Path

    @property
    def completed(self) -> bool:
        """Whether the run finished without error."""
        return self.status == "finished:completed"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        if "'" in value:
            raise ValueError(f"run config string values cannot contain a quote. Found {value!r}.")
        return f"'{value}'"
    raise ValueError(f"run config values must be bool, int, float or str. Found {value!r}.")


def toml_overrides(values: Mapping[str, Any]) -> str:
    """Format ``values`` for ``flwr run -c`` / ``--federation-config`` (``k=v k2='s'``).

    Raises:
        ValueError: for a value that is not a bool, int, float or quote-free string.
    """
    return " ".join(f"{key}={_toml_value(value)}" for key, value in values.items())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _proc_stat(pid: int) -> tuple[str, int] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1])


def _alive(pid: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[0] != "Z"


def _all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _descendants(roots: list[int]) -> set[int]:
    parent = {}
    for pid in _all_pids():
        stat = _proc_stat(pid)
        if stat is not None:
            parent[pid] = stat[1]
    found = set(roots)
    grew = True
    while grew:
        grew = False
        for pid, ppid in parent.items():
            if ppid in found and pid not in found:
                found.add(pid)
                grew = True
    return found - set(roots)


def _marked(token: str) -> set[int]:
    needle = f"{_MARKER}={token}".encode()
    found = set()
    for pid in _all_pids():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.add(pid)
    return found - {os.getpid()}


class LocalFederation:
    """A SuperLink (and SuperNodes) on loopback for ``flwr run`` (see the module docstring).

    Use it as a context manager::

        with LocalFederation("simulation", num_nodes=20, work_dir=tmp) as federation:
            outcome = federation.run(app_dir, {"num-nodes": 20}, timeout=300)

    Attributes:
        engine: ``simulation`` or ``deployment``.
        num_nodes: Number of (virtual or real) nodes.
        work_dir: Holds ``home/`` (``FLWR_HOME``) and ``logs/``.
        address: ``127.0.0.1:PORT`` of the SuperLink once started.
        processes_stopped: Number of processes stopped on exit.
    """

    def __init__(
        self,
        engine: str,
        *,
        num_nodes: int,
        work_dir: str | Path,
        node_config: Mapping[str, Any] | None = None,
        ray_cpus: int = 1,
        client_cpus: int | None = None,
        startup_timeout: float = 60.0,
        stop_timeout: float = 30.0,
        bin_dir: str | Path | None = None,
    ) -> None:
        """Prepare (nothing starts before ``__enter__``).

        Args:
            engine: ``simulation`` (Ray) or ``deployment`` (SuperNode processes).
            num_nodes: Number of nodes (integer >= 1); SuperNode ``i`` gets the node config
                ``partition-id=i num-partitions=num_nodes`` plus ``node_config``.
            work_dir: Directory for Flower's home and the logs (created).
            node_config: Extra node config of every SuperNode (deployment only).
            ray_cpus: CPUs Ray may use (simulation; integer >= 1).
            client_cpus: CPUs each ClientApp reserves (simulation; integer in
                ``[1, ray_cpus]``; default ``ray_cpus``: one ClientApp at a time). With
                ``ray_cpus=2, client_cpus=1`` Ray runs two ClientApps side by side.
            startup_timeout: Seconds to wait for the SuperLink to answer (> 0).
            stop_timeout: Seconds to wait for processes to exit after ``SIGTERM`` (> 0).
            bin_dir: Directory of the ``flwr`` executables (default: this Python's).

        Raises:
            ValueError: for an argument outside its range.
        """
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}. Found {engine!r}.")
        self.engine = engine
        self.num_nodes = check_int("num_nodes", num_nodes, minimum=1)
        self.ray_cpus = check_int("ray_cpus", ray_cpus, minimum=1)
        self.client_cpus = check_int(
            "client_cpus",
            self.ray_cpus if client_cpus is None else client_cpus,
            minimum=1,
            maximum=self.ray_cpus,
        )
        self.startup_timeout = check_positive("startup_timeout", startup_timeout)
        self.stop_timeout = check_positive("stop_timeout", stop_timeout)
        if node_config and engine != "deployment":
            raise ValueError("node_config applies to the deployment engine only.")
        self.node_config = dict(node_config or {})
        self.bin_dir = Path(bin_dir) if bin_dir is not None else Path(sys.executable).parent
        for tool in ("flwr", "flower-superlink", "flower-supernode"):
            if not (self.bin_dir / tool).exists():
                raise ValueError(
                    f"bin_dir {self.bin_dir} has no {tool}: pip install 'shuffle-opacus[flower]'."
                )
        self.work_dir = Path(work_dir)
        self.address = ""
        self.processes_stopped = 0
        self._token = uuid.uuid4().hex
        self._procs: list[subprocess.Popen] = []
        self._env: dict[str, str] = {}

    # --- start and stop -----------------------------------------------------------------

    def __enter__(self) -> LocalFederation:
        """Start the SuperLink (and the SuperNodes); stop everything if that fails."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop every process (see :meth:`stop`)."""
        self.stop()

    def _start(self) -> None:
        home = self.work_dir / "home"
        logs = self.work_dir / "logs"
        home.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        self.address = f"127.0.0.1:{port}"
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "{_CONNECTION}"\n\n[superlink.{_CONNECTION}]\n'
            f'address = "{self.address}"\ninsecure = true\n'
        )
        self._env = dict(
            os.environ,
            PATH=f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            FLWR_HOME=str(home),
            FLWR_TELEMETRY_ENABLED="0",
            FLWR_DISABLE_UPDATE_CHECK="1",
            **{_MARKER: self._token},
        )
        command = [
            str(self.bin_dir / "flower-superlink"),
            "--insecure",
            "--disable-runtime-dependency-installation",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        if self.engine == "simulation":
            command.insert(2, "--simulation")
        self._spawn(command, logs / "superlink.log")
        self._wait_for_superlink(port)
        if self.engine == "deployment":
            for i in range(self.num_nodes):
                config = {"partition-id": i, "num-partitions": self.num_nodes, **self.node_config}
                self._spawn(
                    [
                        str(self.bin_dir / "flower-supernode"),
                        "--insecure",
                        "--superlink",
                        self.address,
                        "--port",
                        str(_free_port()),
                        "--node-config",
                        toml_overrides(config),
                    ],
                    logs / f"supernode-{i}.log",
                )

    def _spawn(self, command: list[str], log_path: Path) -> None:
        with log_path.open("w") as log:
            self._procs.append(
                subprocess.Popen(command, env=self._env, stdout=log, stderr=subprocess.STDOUT)
            )

    def _wait_for_superlink(self, port: int) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    return
            except OSError:
                if self._procs[0].poll() is not None:
                    raise RuntimeError(
                        f"the SuperLink exited (code {self._procs[0].returncode}); see "
                        f"{self.work_dir / 'logs' / 'superlink.log'}."
                    ) from None
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the SuperLink did not answer within {self.startup_timeout:g} s."
                    ) from None
                time.sleep(0.2)

    def stop(self) -> None:
        """Stop every process started here and all their descendants, by process id.

        Raises:
            RuntimeError: if a process is still alive after ``SIGKILL``.
        """
        roots = [p.pid for p in self._procs]
        targets = _descendants(roots) | _marked(self._token) | set(roots)
        for proc in reversed(self._procs):  # SuperNodes first, the SuperLink last
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in self._procs:
            try:
                proc.wait(timeout=self.stop_timeout)  # reaped, so watchdogs see it gone
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        targets |= _marked(self._token)
        deadline = time.monotonic() + self.stop_timeout
        while any(_alive(pid) for pid in targets) and time.monotonic() < deadline:
            time.sleep(0.2)
            targets |= _marked(self._token)
        for pid in sorted(targets):
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        left = sorted(pid for pid in targets | _marked(self._token) if _alive(pid))
        self.processes_stopped = len(targets)
        self._procs = []
        if left:
            raise RuntimeError(f"processes still alive after SIGKILL: {left}")

    # --- runs ---------------------------------------------------------------------------

    def _flwr(self, args: list[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.bin_dir / "flwr"), *args], env=self._env, timeout=timeout, **kwargs
        )

    def run(
        self,
        app_dir: str | Path,
        run_config: Mapping[str, Any] | None = None,
        *,
        timeout: float,
        on_line: Callable[[str], None] | None = None,
    ) -> RunOutcome:
        """Submit the app with ``flwr run --stream``, wait for its end, return its status.

        The streamed log is written to ``logs/run-<run id>.log`` (``run-not-started-*.log`` if
        no run id was given) and, line by line, handed to ``on_line`` while the run goes.

        Args:
            app_dir: Directory with the app's ``pyproject.toml``.
            run_config: Overrides of the app's ``[tool.flwr.app.config]``.
            timeout: Seconds before ``flwr run`` is killed (> 0); the run then counts as
                ``timeout``.
            on_line: Called with every line of the streamed log, as it arrives.

        Returns:
            A :class:`RunOutcome`.

        Raises:
            RuntimeError: if the federation is not started.
        """
        if not self._procs:
            raise RuntimeError("the federation is not started; use it in a with statement.")
        timeout = check_positive("timeout", timeout)
        log_path = self.work_dir / "logs" / f"run-pending-{uuid.uuid4().hex[:8]}.log"
        args = ["run", str(app_dir), _CONNECTION, "--stream"]
        if run_config:
            args += ["-c", toml_overrides(run_config)]
        if self.engine == "simulation":
            federation = {
                "num-supernodes": self.num_nodes,
                "client-resources-num-cpus": self.client_cpus,
                "init-args-num-cpus": self.ray_cpus,
            }
            args += ["--federation-config", toml_overrides(federation)]
        started = time.monotonic()
        status = ""
        run_id: int | None = None
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                [str(self.bin_dir / "flwr"), *args],
                env=self._env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            )
            ids: list[int] = []

            def pump() -> None:  # copy the stream to the log and to on_line, line by line
                assert proc.stdout is not None
                for line in proc.stdout:
                    log.write(line)
                    log.flush()
                    if not ids and (found := re.search(r"Successfully started run (\d+)", line)):
                        ids.append(int(found.group(1)))
                    if on_line is not None:
                        on_line(line.rstrip("\n"))

            reader = threading.Thread(target=pump, daemon=True)
            reader.start()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                status = "timeout"
            reader.join(timeout=30.0)
            run_id = ids[0] if ids else None
        seconds = time.monotonic() - started
        named = log_path.with_name(
            f"run-{run_id}.log"
            if run_id is not None
            else log_path.name.replace("pending", "not-started")
        )
        os.replace(log_path, named)
        if run_id is None:
            return RunOutcome(None, status or "not-started", seconds, named)
        if not status:
            listing = self._flwr(
                ["list", _CONNECTION, "--run-id", str(run_id), "--format", "json"],
                60.0,
                capture_output=True,
                text=True,
            )
            try:
                status = json.loads(listing.stdout)["runs"][0]["status"]
            except (ValueError, KeyError, IndexError):
                status = "unknown"
        return RunOutcome(run_id, status, seconds, named)


class RoundPrinter:
    """Turn the strategies' log lines into one console line per round.

    The check-in strategies log ``round N: <counts>, epsilon = E (delta = D)`` after each round
    (``R reports`` in the trusted-server mode; the nodes in the secure sum and the number checked
    in under SecAgg+) and ``round N: server evaluation {...}`` when the app evaluates; this
    prints ``round N: <counts>, epsilon E (delta D)``, with the evaluation's accuracy appended
    when there is one, as soon as the round's lines are complete.

    Args:
        write: Where the lines go (``print`` by default).
        total: Rounds configured, shown as ``N/total`` when given.
    """

    _ROUND = re.compile(r"round (\d+): (.*?), epsilon = (\S+) \(delta = ([^)]+)\)")
    _EVAL = re.compile(r"round (\d+): server evaluation (\{.*\})")
    _ACCURACY = re.compile(r"'([\w-]*accuracy[\w-]*)': ([0-9.eE+-]+)")

    def __init__(self, write: Callable[[str], None] = print, total: int | None = None) -> None:
        self.write = write
        self.total = total
        self._pending: tuple[int, str] | None = None
        self.rounds_printed = 0

    def __call__(self, line: str) -> None:
        """Read one log line."""
        if found := self._ROUND.search(line):
            self.flush()
            number, counts, epsilon, delta = found.groups()
            where = f"{number}/{self.total}" if self.total else number
            text = f"round {where}: {counts}, epsilon {epsilon} (delta {delta})"
            self._pending = (int(number), text)
        elif (found := self._EVAL.search(line)) and self._pending is not None:
            if int(found.group(1)) == self._pending[0]:
                accuracy = self._ACCURACY.search(found.group(2))
                if accuracy is not None:
                    name, value = accuracy.groups()
                    self._pending = (self._pending[0], f"{self._pending[1]}, {name} {value}")
                self.flush()

    def flush(self) -> None:
        """Print the round held back, if any."""
        if self._pending is not None:
            self.write(self._pending[1])
            self.rounds_printed += 1
            self._pending = None


def _app_config_keys(app_dir: Path) -> dict[str, Any]:
    """Return the app's ``[tool.flwr.app.config]`` table (empty if there is none)."""
    tomllib = _tomllib()
    try:
        data = tomllib.loads((app_dir / "pyproject.toml").read_text())
    except (OSError, ValueError):
        return {}
    config = data.get("tool", {}).get("flwr", {}).get("app", {}).get("config", {})
    return config if isinstance(config, dict) else {}


def _tomllib() -> Any:
    """``tomllib`` (Python 3.11+) or ``tomli`` (3.10, a dependency of flwr)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    return tomllib


def _parse_overrides(text: str) -> dict[str, Any]:
    tomllib = _tomllib()
    values: dict[str, Any] = {}
    for item in text.split():
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"-c takes key=value pairs. Found {item!r}.")
        values[key] = tomllib.loads(f"v = {value}")["v"]
    return values


def main(argv: list[str] | None = None) -> int:
    """Command line: start a local federation, run an app once, stop everything.

    Returns:
        0 if the run completed, 1 otherwise.
    """
    parser = argparse.ArgumentParser(
        prog="python -m shuffle_opacus.flower.launch",
        description="Run a Flower app on loopback and stop every process afterwards.",
    )
    parser.add_argument("engine", choices=ENGINES)
    parser.add_argument("app_dir", type=Path)
    parser.add_argument("--nodes", type=int, required=True, help="number of nodes")
    parser.add_argument("-c", "--run-config", default="", help="overrides, 'k=v k2=v2'")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds for the run")
    parser.add_argument("--work-dir", type=Path, default=None, help="logs and Flower home")
    args = parser.parse_args(argv)
    try:
        overrides = _parse_overrides(args.run_config)
    except ValueError as exc:
        parser.error(str(exc))
    if args.nodes < 1:
        parser.error(f"--nodes must be an integer >= 1. Found {args.nodes}.")
    # The app's num-nodes (its population n, the accountant's n) and the nodes started must be
    # one number: --nodes sets it, and a different -c num-nodes is refused before anything starts.
    app_config = _app_config_keys(args.app_dir)
    if "num-nodes" in overrides and overrides["num-nodes"] != args.nodes:
        parser.error(
            f"-c num-nodes={overrides['num-nodes']} disagrees with --nodes {args.nodes}; give one "
            f"number (--nodes sets the app's num-nodes)."
        )
    if "num-nodes" in app_config:
        overrides["num-nodes"] = args.nodes
    total = next(
        (
            c[k]
            for k in ("num-server-rounds", "num-rounds")
            for c in (overrides, app_config)
            if k in c
        ),
        None,
    )
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="flower-"))
    started = time.monotonic()
    printer = RoundPrinter(
        lambda text: print(text, flush=True), total if isinstance(total, int) else None
    )
    print(
        f"starting a local {args.engine} federation of {args.nodes} nodes "
        f"(logs in {work / 'logs'})",
        flush=True,
    )
    with LocalFederation(args.engine, num_nodes=args.nodes, work_dir=work) as federation:
        up = time.monotonic() - started
        print(f"federation up in {up:.1f} s; running {args.app_dir}", flush=True)
        outcome = federation.run(args.app_dir, overrides, timeout=args.timeout, on_line=printer)
        printer.flush()
    total_s = time.monotonic() - started
    print(f"run {outcome.run_id}: {outcome.status}")
    print(f"federation up in {up:.1f} s, run {outcome.seconds:.1f} s, total {total_s:.1f} s")
    print(f"{federation.processes_stopped} processes stopped; log {outcome.log_path}")
    return 0 if outcome.completed else 1


if __name__ == "__main__":
    sys.exit(main())
