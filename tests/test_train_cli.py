"""`hetcluster train` / `evaluate` input errors: one line, non-zero exit, no traceback, no TF needed."""

import subprocess
import sys

from hetcluster.agent.credentials import generate_credentials
from hetcluster.training.servers import free_address


def run_cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hetcluster.cli.app", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def _inventory(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text(f"""[cluster]
name = "t"
network = "loopback"
parameter_server_host = "127.0.0.1"

[[devices]]
name = "ghost"
address = "{free_address('127.0.0.1')}"
token_file = "creds/token"
ca_file = "creds/ca.crt"
cert_file = "creds/client.crt"
key_file = "creds/client.key"
""")
    generate_credentials(tmp_path / "creds")
    return path


def test_unreachable_agent_at_start_is_one_line_naming_it(tmp_path):
    result = run_cli("train", "--inventory", str(_inventory(tmp_path)), "--workdir", str(tmp_path / "job"),
                     "--total-steps", "500")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "ghost" in lines[0] and "--allow-missing" in lines[0]


def test_resume_without_a_job_says_so(tmp_path):
    result = run_cli("train", "--inventory", str(_inventory(tmp_path)), "--workdir", str(tmp_path / "none"), "--resume")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "Nothing to resume" in result.stderr


def test_evaluate_rejects_unknown_configuration(tmp_path):
    result = run_cli("evaluate", "--inventory", str(_inventory(tmp_path)), "--configs", "ghost+nobody",
                     "--out", str(tmp_path / "r.json"))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "--configs" in result.stderr and "nobody" in result.stderr


def test_evaluate_rejects_zero_repeats(tmp_path):
    result = run_cli("evaluate", "--inventory", str(_inventory(tmp_path)), "--repeats", "0",
                     "--out", str(tmp_path / "r.json"))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "--repeats" in result.stderr and len([line for line in result.stderr.splitlines() if line.strip()]) == 1


def test_a_report_or_result_path_that_cannot_be_written_is_refused_before_any_work(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for command in (("train", "--report"), ("evaluate", "--out")):
        result = run_cli(command[0], "--inventory", str(_inventory(tmp_path)), "--workdir", str(tmp_path / "job"),
                         command[1], str(blocker / "r.json"))
        assert result.returncode != 0 and "Traceback" not in result.stderr
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "is not a folder" in lines[0], result.stderr   # not the unreachable agent
