"""The house rules a linter cannot see: no lab notes in the code, a README and an experiments page
of the sizes a reader can take in.

    python scripts/check_prose.py [ROOT]

Fails (exit 1, one line per finding) where a line under hetcluster/ or a reference page in docs/
carries a session's history ("stop 87"), a date, or a recording count that goes stale by
construction; where README.md runs over 1,000 words; or where docs/experiments.md runs over 400
lines. Figures belong in docs/decisions.md, docs/experiments.md, benchmark output and generated
tables, so those two pages are not checked for them.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

STALE = re.compile(r"stop [0-9]+(?![0-9]|\.[0-9])|20[0-9]{2}-[0-9]{2}-[0-9]{2}|[0-9]+ recordings")
README_MAX_WORDS = 1000
EXPERIMENTS_MAX_LINES = 400
FIGURE_PAGES = {"decisions.md", "experiments.md"}
NOT_YET_CHECKED: set[str] = set()


def findings(root: Path) -> list[str]:
    found = []
    code = [path for path in sorted((root / "hetcluster").rglob("*.py"))
            if "proto" not in path.relative_to(root).parts]   # generated
    pages = [path for path in sorted((root / "docs").glob("*.md")) if path.name not in FIGURE_PAGES | NOT_YET_CHECKED]
    for path in code + pages:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            match = STALE.search(line)
            if match:
                found.append(f"{path.relative_to(root)}:{number}: {match.group(0)!r}: a note that goes stale; "
                             "keep figures in docs/decisions.md")
    words = len((root / "README.md").read_text(encoding="utf-8").split())
    if words > README_MAX_WORDS:
        found.append(f"README.md: {words} words, over {README_MAX_WORDS}")
    lines = len((root / "docs" / "experiments.md").read_text(encoding="utf-8").splitlines())
    if lines > EXPERIMENTS_MAX_LINES:
        found.append(f"docs/experiments.md: {lines} lines, over {EXPERIMENTS_MAX_LINES}")
    return found


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    found = findings(root)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
