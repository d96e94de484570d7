"""Rules a change must keep: the pure rooms import no TensorFlow, gRPC or model registry; no lab
notes come back into the code or the reference docs; the README and the experiments page keep their
sizes."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PURE = [*sorted((ROOT / "hetcluster" / "planner").glob("*.py")),
        *(ROOT / "hetcluster" / "memory" / f"{name}.py" for name in
          ("__init__", "budget", "checkpoints", "cost", "fit", "graph", "liveness", "plan", "planning_utils", "route"))]
FORBIDDEN = ("tensorflow", "tf_keras", "keras", "grpc", "hetcluster.models.registry", "hetcluster.memory.keras_graph",
             "hetcluster.memory.executor", "hetcluster.memory.model_graph", "hetcluster.agent", "hetcluster.proto")


def imported(path: Path) -> set[str]:
    """Every module a file imports, at its top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_pure_rooms_import_no_tensorflow_grpc_or_model_registry_anywhere():
    assert len(PURE) > 20
    bad = {str(path.relative_to(ROOT)): sorted(n for n in imported(path) if n.startswith(FORBIDDEN) or n in FORBIDDEN)
           for path in PURE}
    assert not {path: names for path, names in bad.items() if names}


def test_importing_them_loads_none_of_it():
    modules = [".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__") for path in PURE]
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            f"print(sorted(m for m in sys.modules if m.startswith({FORBIDDEN!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_no_lab_notes_and_the_pages_keep_their_sizes(tmp_path):
    check = [sys.executable, str(ROOT / "scripts" / "check_prose.py")]
    assert subprocess.run(check, capture_output=True, text=True).returncode == 0
    # the same check on a copy with one planted line fails, naming it
    copy = tmp_path / "tree"
    shutil.copytree(ROOT / "hetcluster", copy / "hetcluster", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "README.md", copy)
    note = "measured on 2026-12-01 over 212 recordings (stop 88)"
    # figures belong in decisions.md: a dated note there is no finding
    (copy / "docs" / "decisions.md").write_text((copy / "docs" / "decisions.md").read_text() + f"\n{note}\n")
    assert subprocess.run([*check, str(copy)], capture_output=True, text=True).returncode == 0
    planted = copy / "hetcluster" / "planner" / "choose.py"
    planted.write_text(planted.read_text() + f"\n# {note}\n")
    failed = subprocess.run([*check, str(copy)], capture_output=True, text=True)
    assert failed.returncode == 1 and "hetcluster/planner/choose.py" in failed.stdout
    # a reference page is held to the same rule
    page = copy / "docs" / "planner.md"
    page.write_text(page.read_text() + f"\nOn this host, {note}.\n")
    assert "docs/planner.md" in subprocess.run([*check, str(copy)], capture_output=True, text=True).stdout
    (copy / "README.md").write_text("word " * 1001)
    assert "README.md: 1001 words" in subprocess.run([*check, str(copy)], capture_output=True, text=True).stdout
