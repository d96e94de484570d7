"""Execute an experiment notebook headless (nbclient), as CI does and as a user regenerates figures.

The notebooks read their parameters from environment variables (HETCLUSTER_EXPERIMENTS_REDUCED=1
for the reduced configuration, HETCLUSTER_EXPERIMENTS_OUT for another results folder), so there
is no injected parameters cell to keep in sync. The kernel is "python3" as launched by
jupyter_client, which runs it with this interpreter (sys.executable), i.e. the venv's.

Usage: .venv/bin/python -m experiments.run_notebook NAME [--reduced] [--in-place] [--out-dir DIR]
  NAME: compare_preferences, choice_accuracy or memory_capacity.
  --in-place writes the executed notebook (with its outputs) back over experiments/NAME.ipynb.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Mapping

EXPERIMENTS = Path(__file__).resolve().parent
NOTEBOOKS = ("compare_preferences", "choice_accuracy", "memory_capacity")


def execute(name: str, env: Mapping[str, str], timeout_s: int = 1800, output: Path | None = None):
    """Run experiments/NAME.ipynb top to bottom with ``env`` added to the kernel's environment.

    Returns the executed notebook; a failing cell raises nbclient's CellExecutionError with the
    cell's traceback. ``output`` (optional) receives the executed notebook, written atomically.
    """
    import nbformat
    from nbclient import NotebookClient

    from hetcluster.fileio import write_text_atomic

    nb = nbformat.read(EXPERIMENTS / f"{name}.ipynb", as_version=4)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        NotebookClient(nb, kernel_name="python3", timeout=timeout_s,
                       resources={"metadata": {"path": str(EXPERIMENTS)}}).execute()
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    if output is not None:
        write_text_atomic(output, nbformat.writes(nb))
    return nb


def main() -> int:
    parser = argparse.ArgumentParser(description="Execute an experiment notebook headless.")
    parser.add_argument("name", choices=NOTEBOOKS)
    parser.add_argument("--reduced", action="store_true")
    parser.add_argument("--in-place", action="store_true")
    parser.add_argument("--out-dir", type=Path, help="results folder (default: experiments/results/<name>/<config>)")
    args = parser.parse_args()
    env = {"HETCLUSTER_EXPERIMENTS_REDUCED": "1" if args.reduced else "0"}
    if args.out_dir:
        env["HETCLUSTER_EXPERIMENTS_OUT"] = str(args.out_dir.resolve())
    execute(args.name, env, output=EXPERIMENTS / f"{args.name}.ipynb" if args.in_place else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
