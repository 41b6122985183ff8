"""A SuperLink (and SuperNodes) on loopback for ``flwr run``, and every process stopped after.

:class:`LocalFederation` starts one SuperLink on loopback, with Flower's simulation engine (Ray
runs ``num_nodes`` virtual nodes) or with ``num_nodes`` SuperNode processes (the deployment
engine, as on real machines), submits runs with ``flwr run … --stream`` and reads each run's
final status with ``flwr list`` (``flwr run`` exits with 0 even when the run failed). It uses a
private ``FLWR_HOME``, switches off telemetry and update checks, and starts the SuperLink with
``--disable-runtime-dependency-installation``, so the apps import from this environment. Every
config goes to Flower as a TOML file (:func:`write_config`). Every process started here carries
a marker in its environment, which Flower's and Ray's subprocesses inherit; on exit psutil finds
the marked processes and the descendants of the ones started here, and they are stopped
(``SIGTERM``, a wait, then ``SIGKILL``). :mod:`.launch` is the command line around it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil  # type: ignore[import-untyped]
import tomli_w

from ..common.validation import check_int, check_positive

__all__ = ["ENGINES", "LocalFederation", "RunOutcome", "write_config"]

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


def write_config(path: str | Path, values: Mapping[str, Any]) -> Path:
    """Write a flat run, node or federation config as a TOML file that Flower reads.

    ``flwr run -c``, ``flwr run --federation-config`` and ``flower-supernode --node-config``
    each take the path of such a file in place of ``k=v`` pairs.

    Args:
        path: The file to write (its name must end in ``.toml``; folders are created).
        values: The config: keys to bool, int, float (``inf`` included) or str values.

    Returns:
        ``path``, as a ``Path``.

    Raises:
        ValueError: for a path not ending in ``.toml`` or a value of another type.
    """
    path = Path(path)
    if path.suffix != ".toml":
        raise ValueError(f"path must end in .toml (Flower reads such a file). Found {path}.")
    for key, value in values.items():
        if not isinstance(value, bool | int | float | str):
            raise ValueError(
                f"run config values must be bool, int, float or str. Found {key}={value!r}."
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(dict(values)))
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _alive(process: psutil.Process) -> bool:
    """Whether ``process`` still runs (a zombie, or a pid taken by another process, does not)."""
    try:
        return bool(process.is_running()) and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def _marked(token: str) -> set[psutil.Process]:
    """Return the processes (other than this one) whose environment carries the marker."""
    found = set()
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.pid != os.getpid() and process.environ().get(_MARKER) == token:
                found.add(process)
    return found


def _descendants(processes: Iterable[psutil.Process]) -> set[psutil.Process]:
    found: set[psutil.Process] = set()
    for process in processes:
        with contextlib.suppress(psutil.Error):
            found.update(process.children(recursive=True))
    return found


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
        self._procs: list[psutil.Popen] = []
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
        connection = {"address": self.address, "insecure": True}
        superlink = {"superlink": {"default": _CONNECTION, _CONNECTION: connection}}
        (home / "config.toml").write_text(tomli_w.dumps(superlink))
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
                        str(write_config(self.work_dir / "config" / f"supernode-{i}.toml", config)),
                    ],
                    logs / f"supernode-{i}.log",
                )

    def _spawn(self, command: list[str], log_path: Path) -> None:
        with log_path.open("w") as log:
            self._procs.append(
                psutil.Popen(command, env=self._env, stdout=log, stderr=subprocess.STDOUT)
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
        """Stop every process started here and all their descendants, through psutil.

        ``SIGTERM`` to the processes started here (SuperNodes first), a wait of
        ``stop_timeout`` for them, their descendants and every process with the marker, then
        ``SIGKILL`` to any of them still running.

        Raises:
            RuntimeError: if a process is still alive after ``SIGKILL``.
        """
        targets = set(self._procs) | _descendants(self._procs) | _marked(self._token)
        for process in reversed(self._procs):  # SuperNodes first, the SuperLink last
            with contextlib.suppress(psutil.NoSuchProcess):
                process.terminate()
        for process in self._procs:
            try:
                process.wait(timeout=self.stop_timeout)  # reaped, so watchdogs see it gone
            except psutil.TimeoutExpired:
                process.kill()
                process.wait()
        targets |= _marked(self._token)
        deadline = time.monotonic() + self.stop_timeout
        while any(_alive(p) for p in targets) and time.monotonic() < deadline:
            time.sleep(0.2)
            targets |= _marked(self._token)
        for process in targets:
            if _alive(process):
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
        time.sleep(0.2)
        left = sorted(p.pid for p in targets | _marked(self._token) if _alive(p))
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
        configs = self.work_dir / "config"
        args = ["run", str(app_dir), _CONNECTION, "--stream"]
        if run_config:
            args += ["-c", str(write_config(configs / f"{log_path.stem}.toml", run_config))]
        if self.engine == "simulation":
            federation = {
                "num-supernodes": self.num_nodes,
                "client-resources-num-cpus": self.client_cpus,
                "init-args-num-cpus": self.ray_cpus,
            }
            path = write_config(configs / "federation.toml", federation)
            args += ["--federation-config", str(path)]
        started = time.monotonic()
        status = ""
        run_id: int | None = None
        with log_path.open("w") as log:
            proc = psutil.Popen(
                [str(self.bin_dir / "flwr"), *args],
                env=self._env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            )
            ids: list[int] = []

            def pump() -> None:  # copy the stream to the log and to on_line, line by line
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
            except psutil.TimeoutExpired:
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
