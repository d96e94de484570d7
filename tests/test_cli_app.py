"""The CLI shell: help is fast and light, bad input is one line and a non-zero exit."""

import subprocess
import sys


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hetcluster.cli.app", *args], capture_output=True, text=True, timeout=120
    )


def test_help_does_not_import_tensorflow():
    code = (
        "import sys; from hetcluster.cli import app; "
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported by --help path'; "
        "assert 'sklearn' not in sys.modules, 'sklearn imported by --help path'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_help_lists_usage():
    result = run_cli("--help")
    assert result.returncode == 0
    assert "Usage" in result.stdout


def test_unknown_command_is_one_line_error():
    result = run_cli("no-such-command")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
