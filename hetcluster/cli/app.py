"""The typer application: composes one small module per command.

Command modules import nothing heavy at module level (TensorFlow, scikit-learn load inside
the command function), so `hetcluster --help` stays fast. `main()` turns every
`HetclusterError` into one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import logging
import os
import sys

import typer

from hetcluster.errors import HetclusterError
from hetcluster.tfenv import prepare_tf_env

app = typer.Typer(
    name="hetcluster",
    help="Choose which devices of a heterogeneous fleet train a DNN job, then train it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at DEBUG level."),
) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _register() -> None:
    """Attach every command module that exists; each module adds itself to `app`."""
    import importlib
    import pkgutil

    import hetcluster.cli as cli_pkg

    for info in sorted(pkgutil.iter_modules(cli_pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("cmd_"):
            module = importlib.import_module(f"hetcluster.cli.{info.name}")
            module.register(app)


_register()


def main() -> None:
    # TF's C++ runtime logs "failed call to cuInit" at ERROR level on every machine without a GPU;
    # a user's terminal gets our one-line errors instead (run with TF_CPP_MIN_LOG_LEVEL=0 to see TF's).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    prepare_tf_env()
    try:
        app()  # standalone mode: typer reports usage errors itself and exits 2
    except HetclusterError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)


if __name__ == "__main__":
    main()
