"""scikit-learn's bundled digits (1797 real 8x8 grey images of 0-9, no download) as a job's data.

    python -m hetcluster.models.digits OUT.npz [--side 32]

writes ``x`` [N, side, side, 1] uint8 (each pixel a block of side/8 pixels) and ``y`` [N] labels:
what `make demo` and the end-to-end tests train on, so a job's held-out accuracy means something.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hetcluster.fileio import write_atomic


def write_digits_npz(path: Path | str, side: int = 32) -> Path:
    """The digits upscaled to ``side`` (a multiple of 8) as an .npz of ``x`` and ``y``."""
    import numpy as np
    from sklearn.datasets import load_digits

    if side % 8:
        raise ValueError(f"side {side} is not a multiple of 8")
    digits = load_digits()
    images = np.round(digits.images / 16.0 * 255.0).astype("uint8")
    block = np.ones((1, side // 8, side // 8), dtype="uint8")
    x = np.kron(images, block)[..., None]
    return write_atomic(path, lambda tmp: np.savez(tmp, x=x, y=digits.target.astype("int64")), suffix=".npz")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--side", type=int, default=32)
    args = parser.parse_args(argv)
    print(write_digits_npz(args.out, args.side))


if __name__ == "__main__":
    main()
