"""Smoke check of the installed distributions, run by ``.ci/package`` in a fresh environment.

Run it with ``python -I`` from a directory outside the repository, so that only the installed
wheels can be imported. It checks that

* ``shuffle_opacus`` and ``shuffle_experiments`` come from this environment's site-packages,
  and ``shuffle_opacus`` carries ``py.typed``;
* ``import shuffle_opacus`` registers the three accountants with Opacus;
* every module the wheels installed imports (``shuffle_opacus.flower`` only where the optional
  ``flwr`` is installed);
* ``shuffle-opacus account shuffle --n 1000 --sigma 1 --steps 10`` answers with an epsilon;
* ``shuffle-experiment --help`` answers and ``shuffle-experiment train`` runs one round of the
  smoke config and writes its summary.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import warnings
from pathlib import Path

BIN = Path(sys.executable).parent
SITE = Path(sysconfig.get_paths()["purelib"]).resolve()
# The console scripts run without the variables that could put a source tree on sys.path.
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def fail(message: str) -> None:
    """Stop the check with ``message``.

    Args:
        message: What went wrong.

    Raises:
        SystemExit: always.
    """
    raise SystemExit(f"package smoke check failed: {message}")


def installed_modules(distribution: str) -> list[str]:
    """Return the modules a distribution installed, from its RECORD.

    Args:
        distribution: The distribution's name.

    Returns:
        Dotted module names, packages included.
    """
    files = importlib.metadata.files(distribution) or []
    modules = []
    for file in files:
        parts = file.parts
        if file.suffix != ".py" or parts[0].endswith(".dist-info"):
            continue
        names = list(parts[:-1]) + ([] if parts[-1] == "__init__.py" else [file.stem])
        modules.append(".".join(names))
    return sorted(modules)


def run(command: list[str], cwd: Path) -> str:
    """Run an installed console script and return its output.

    Args:
        command: The script's name in this environment's ``bin`` and its arguments.
        cwd: The working directory.

    Returns:
        Standard output.
    """
    proc = subprocess.run(
        [str(BIN / command[0]), *command[1:]],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        fail(f"{' '.join(command)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def main() -> None:
    """Run the checks, printing one line per check."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="configs/smoke.yaml of the repository")
    parser.add_argument("--out", required=True, help="output directory of the training run")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import shuffle_experiments

    import shuffle_opacus

    for module in (shuffle_opacus, shuffle_experiments):
        origin = Path(module.__file__ or "").resolve()
        if SITE not in origin.parents:
            fail(f"{module.__name__} imported from {origin}, not from {SITE}")
    if not (Path(shuffle_opacus.__file__ or "").parent / "py.typed").is_file():
        fail("shuffle_opacus/py.typed is not installed")
    print(f"installed: shuffle_opacus and shuffle_experiments from {SITE}, with py.typed")

    from opacus import PrivacyEngine
    from opacus.accountants import create_accountant

    for name in ("shuffle", "subsampled_shuffle", "shuffled_checkin"):
        accountant = create_accountant(name)
        if accountant.mechanism() != name or not type(accountant).__module__.startswith(
            "shuffle_opacus."
        ):
            fail(f"Opacus accountant {name!r} is {type(accountant)}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus's notice that secure_mode is off
        PrivacyEngine(accountant="shuffled_checkin")
    print("registered: shuffle, subsampled_shuffle, shuffled_checkin with Opacus")

    has_flwr = importlib.util.find_spec("flwr") is not None
    count, skipped = 0, 0
    for distribution in ("shuffle-opacus", "shuffle-opacus-experiments"):
        for name in installed_modules(distribution):
            if name.endswith(".__main__"):  # runs the command line
                continue
            if name.startswith("shuffle_opacus.flower") and not has_flwr:
                skipped += 1
                continue
            importlib.import_module(name)
            count += 1
    if count < 40:
        fail(f"only {count} modules installed")
    note = f" ({skipped} of shuffle_opacus.flower skipped: no flwr)" if skipped else ""
    print(f"imported: {count} modules of the two wheels{note}")

    account = ["shuffle-opacus", "account", "shuffle", "--n", "1000", "--sigma", "1"]
    text = run([*account, "--steps", "10", "--json"], out)
    record = json.loads(text.splitlines()[0])
    if not 0.0 < record["epsilon"] < float("inf"):
        fail(f"shuffle-opacus account answered {record}")
    print(f"shuffle-opacus account shuffle --n 1000 --sigma 1 --steps 10: eps {record['epsilon']}")

    if "train" not in run(["shuffle-experiment", "--help"], out):
        fail("shuffle-experiment --help does not list train")
    overrides = {
        "output_dir": str(out),
        "data.train_subset": "200",
        "data.test_subset": "100",
        "training.rounds": "1",
        "training.eval_every": "1",
        "training.checkpoint_every": "1",
        "privacy.accountants": "[exact]",
    }
    command = ["shuffle-experiment", "train", "--config", args.config, "--no-progress"]
    for key, value in overrides.items():
        command += ["--set", f"{key}={value}"]
    run(command, out)
    # OUT/NAME/<timestamp>/summary.json (OUT/NAME/latest links to the run directory).
    summaries = [p for p in out.glob("*/*/summary.json") if not p.parent.is_symlink()]
    if len(summaries) != 1:
        fail(f"shuffle-experiment train wrote {summaries} under {out}")
    print(f"shuffle-experiment --help, and train: one round of the smoke config ({summaries[0]})")


if __name__ == "__main__":
    main()
