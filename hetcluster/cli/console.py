"""The rich console every command prints through.

Rich wraps at 80 columns when the output is not a terminal (a pipe, a CI log, `make demo > log`),
which folds our tables into unreadable cells; such outputs get a fixed width instead.
"""

from __future__ import annotations

from rich.console import Console

PIPE_WIDTH = 120


def make_console(*, stderr: bool = False) -> Console:
    console = Console(stderr=stderr)
    if not console.is_terminal:
        console = Console(stderr=stderr, width=PIPE_WIDTH)
    return console
