"""The reproductions the README promises: choice accuracy, compare preferences, memory capacity.

Run every script as a module from the repository root, e.g. ``python -m experiments.replan --all-repeated``;
the modules import each other as ``experiments.<name>``. One-off studies of the measurements live apart in
``experiments.investigations``. See experiments/README.md.
"""
