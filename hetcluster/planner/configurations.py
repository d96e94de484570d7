"""Configurations as numbers: bit masks over devices, or count vectors over device classes.

A configuration is a non-empty subset of the fleet. With n distinct devices it is a bit mask in
1..2^n-1; with identical devices grouped into classes it is a vector of how many of each class
join (Π(c_k+1)-1 of them). Both become a weight matrix W (configurations × units) so that every
sum over members is a matrix product, computed once for all configurations.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pandas.api.extensions import ExtensionArray, ExtensionDtype, take

from hetcluster.errors import PlanningError

MAX_EXACT_DEVICES = 62  # masks are int64


def enumerate_configurations(n: int) -> np.ndarray:
    """All non-empty subsets of n devices as int64 bit masks 1..2^n-1 (bit i = device i)."""
    if n < 1:
        raise PlanningError(f"Cannot enumerate configurations of {n} devices.", hint="give at least one device.")
    if n > MAX_EXACT_DEVICES:
        raise PlanningError(
            f"{n} devices are too many to enumerate subsets exactly.",
            hint="give identical devices a class_key so they are grouped into classes.",
        )
    return np.arange(1, 1 << n, dtype=np.int64)


def class_configurations(counts) -> np.ndarray:
    """All non-zero count vectors k with 0 <= k_c <= counts[c]: (Π(c+1)-1) × len(counts) int64.

    Mixed-radix enumeration with the first class varying fastest, the zero vector left out.
    """
    counts = np.asarray(counts, dtype=np.int64)
    if counts.ndim != 1 or counts.size == 0 or np.any(counts < 0):
        raise PlanningError(f"Class counts must be a non-empty list of non-negative integers, got {counts!r}.")
    radices = counts + 1
    total = int(np.prod(radices.astype(object)))
    if total > 50_000_000:
        raise PlanningError(
            f"{total - 1} class configurations are too many to enumerate.",
            hint="use planner.plan(), which searches count vectors instead of listing them all.",
        )
    index = np.arange(1, total, dtype=np.int64)
    out = np.empty((index.size, counts.size), dtype=np.int64)
    for c, radix in enumerate(radices):
        out[:, c] = index % radix
        index //= radix
    return out


def count_class_configurations(counts) -> int:
    """Π(c_k+1)-1 as an exact Python int (may be astronomically large)."""
    total = 1
    for c in counts:
        total *= int(c) + 1
    return total - 1


def row_sums(matrix: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Σ over each row of a (rows × a few columns) matrix — of ``weights * matrix`` when weights
    are given — as a matrix-vector product (or one einsum): numpy's sum(axis=1) over so few
    columns is several times slower, and this is the planner's hot path. Float matrices keep
    their precision (the queue solve runs in float32)."""
    matrix = np.asarray(matrix)
    if weights is not None:
        return np.einsum("ij,ij->i", weights, matrix)
    if matrix.dtype.kind != "f":
        matrix = matrix.astype(np.float64)
    return matrix @ np.ones(matrix.shape[1], dtype=matrix.dtype)


def membership(masks: np.ndarray, n: int, dtype=np.float64) -> np.ndarray:
    """Bit masks → 0/1 weight matrix (len(masks) × n), via np.unpackbits on the mask bytes."""
    masks = np.ascontiguousarray(np.asarray(masks, dtype="<i8"))
    bits = np.unpackbits(masks.view(np.uint8).reshape(-1, 8), axis=1, bitorder="little")[:, :n]
    return bits.astype(dtype)


def _object_array(items: list) -> np.ndarray:
    arr = np.empty(len(items), dtype=object)
    arr[:] = items
    return arr


def names_for_masks(masks: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
    """Object array of name tuples, one per mask, built 10 bits at a time by tuple concatenation.

    Looking up pre-built tuples for each 10-bit chunk and adding the object arrays keeps the
    per-configuration work in numpy's C loop (a Python loop over 2^20 masks would take seconds).
    """
    masks = np.asarray(masks, dtype=np.int64)
    result = None
    for start in range(0, len(names), 10):
        chunk = names[start:start + 10]
        table = _object_array(
            [tuple(chunk[i] for i in range(len(chunk)) if v >> i & 1) for v in range(1 << len(chunk))]
        )
        part = table[(masks >> start) & ((1 << len(chunk)) - 1)]
        result = part if result is None else result + part
    if result is None:
        return _object_array([() for _ in range(len(masks))])
    return result


class DeviceSetDtype(ExtensionDtype):
    """pandas dtype of :class:`DeviceSetArray` (elements are tuples of device names)."""

    name = "device_set"
    type = tuple
    kind = "O"
    na_value = None

    @classmethod
    def construct_array_type(cls) -> type:
        return DeviceSetArray


class DeviceSetArray(ExtensionArray):
    """The `devices` column of an exact table: one int64 bit mask per row over one tuple of device
    names. A row's tuple is built when it is read (`table["devices"].iloc[0]`, iteration,
    `to_numpy()`), so a 2^20-row table costs no million Python tuples to build or to sort —
    that was a fifth of planning 20 devices."""

    def __init__(self, masks: np.ndarray, labels: tuple[str, ...]) -> None:
        self._masks = np.asarray(masks, dtype=np.int64)
        self._labels = tuple(labels)

    @property
    def dtype(self) -> DeviceSetDtype:
        return DeviceSetDtype()

    @property
    def masks(self) -> np.ndarray:
        return self._masks

    def __len__(self) -> int:
        return len(self._masks)

    def _names(self, mask: int) -> tuple[str, ...]:
        return tuple(label for i, label in enumerate(self._labels) if mask >> i & 1)

    @staticmethod
    def _mask(names, labels: tuple[str, ...]) -> int | None:
        """The bit mask of ``names`` over ``labels`` (None when a name is not a label)."""
        index = {label: i for i, label in enumerate(labels)}
        if any(name not in index for name in names):
            return None
        return sum(1 << index[name] for name in set(names))

    def __getitem__(self, item):
        if isinstance(item, (int, np.integer)):
            return self._names(int(self._masks[item]))
        return DeviceSetArray(self._masks[item], self._labels)

    def __iter__(self):
        return (self._names(int(mask)) for mask in self._masks)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return names_for_masks(self._masks, self._labels)

    def __eq__(self, other):
        """Elementwise, with tuple semantics: a row equals a tuple of the same names in the same
        (fleet) order."""
        if isinstance(other, (pd.Series, pd.DataFrame, pd.Index)):
            return NotImplemented
        if isinstance(other, tuple):
            mask = self._mask(other, self._labels)
            if mask is None or self._names(mask) != other:
                return np.zeros(len(self), dtype=bool)
            return self._masks == mask
        if isinstance(other, DeviceSetArray) and other._labels == self._labels:
            return self._masks == other._masks
        values = np.asarray(other, dtype=object)
        return np.array([a == b for a, b in zip(self, values)], dtype=bool)

    def map(self, mapper, na_action=None) -> np.ndarray:
        """The mapped values as a plain object array (names joined, lengths...): not device sets."""
        out = np.empty(len(self), dtype=object)
        out[:] = [mapper(item) for item in self]
        return _infer(out)

    def take(self, indices, allow_fill: bool = False, fill_value=None) -> "DeviceSetArray":
        if allow_fill and fill_value not in (None, ()):
            raise ValueError("a device set column is filled only with the empty set")
        return DeviceSetArray(take(self._masks, indices, allow_fill=allow_fill, fill_value=0), self._labels)

    def copy(self) -> "DeviceSetArray":
        return DeviceSetArray(self._masks.copy(), self._labels)

    def isna(self) -> np.ndarray:
        return np.zeros(len(self), dtype=bool)

    @property
    def nbytes(self) -> int:
        return self._masks.nbytes

    @classmethod
    def _from_sequence(cls, scalars, dtype=None, copy: bool = False) -> "DeviceSetArray":
        items = [tuple(s) for s in scalars]
        labels = tuple(dict.fromkeys(name for item in items for name in item))
        return cls(np.array([cls._mask(item, labels) for item in items], dtype=np.int64), labels)

    @classmethod
    def _concat_same_type(cls, to_concat) -> "DeviceSetArray":
        labels = to_concat[0]._labels
        if any(a._labels != labels for a in to_concat):
            return cls._from_sequence([item for a in to_concat for item in a])
        return cls(np.concatenate([a._masks for a in to_concat]), labels)

    def _values_for_factorize(self) -> tuple[np.ndarray, int]:
        return self._masks, -1

    @classmethod
    def _from_factorized(cls, values, original: "DeviceSetArray") -> "DeviceSetArray":
        return cls(values, original._labels)


def _infer(values: np.ndarray) -> np.ndarray:
    """An object array as the narrowest numpy dtype its values allow (bools, numbers), else as is."""
    try:
        inferred = np.array(values.tolist())
    except (ValueError, TypeError):
        return values
    return inferred if inferred.ndim == 1 and inferred.dtype.kind in "biuf" else values


def names_for_counts(counts: np.ndarray, members: tuple[tuple[str, ...], ...]) -> np.ndarray:
    """Object array of concrete device-name tuples: the first k_c members of each class c."""
    result = _object_array([() for _ in range(counts.shape[0])])
    for c, names in enumerate(members):
        prefixes = _object_array([tuple(names[:k]) for k in range(len(names) + 1)])
        result = result + prefixes[counts[:, c]]
    return result


def labels_for_counts(counts: np.ndarray, labels: tuple[str, ...]) -> np.ndarray:
    """Object array of class summaries such as ("jetson-nano×3", "server×1")."""
    result = _object_array([() for _ in range(counts.shape[0])])
    for c, label in enumerate(labels):
        top = int(counts[:, c].max()) if counts.shape[0] else 0
        table = _object_array([(f"{label}×{k}",) if k else () for k in range(top + 1)])
        result = result + table[counts[:, c]]
    return result
