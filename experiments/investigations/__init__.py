"""Investigations: one-off studies of what pre-training measures and how the planner uses it.

Not part of the reproductions (experiments/README.md). Each is a module run from the repository root,
``python -m experiments.investigations.<name>``; the findings are in docs/experiments.md.
"""
