"""The layer graph of a tf_keras functional model (imports TensorFlow; call it lazily).

`flatten_model` walks the functional graph in topological order — nested functional models (the
form keras.applications take when wrapped) are expanded in place — into `KerasOp`s. The executor
replays exactly these ops, so plan layer names and executed layers always agree.
`extract_graph` turns them into the pure `LayerGraph`: output bytes at a batch size and dtype,
parameter bytes, and a FLOPs estimate per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hetcluster.errors import MemoryPlanError
from hetcluster.memory.graph import LayerGraph, LayerNode

# Keras class name -> planner kind (first match along the class's MRO wins).
_KIND_BY_CLASS = {
    "InputLayer": "input",
    "DepthwiseConv2D": "depthwise", "DepthwiseConv1D": "depthwise",
    "Conv": "conv", "SeparableConv": "conv",
    "Dense": "dense", "EinsumDense": "dense",
    "BatchNormalizationBase": "bn", "LayerNormalization": "bn", "GroupNormalization": "bn",
    "ReLU": "activation", "Activation": "activation", "LeakyReLU": "activation", "Softmax": "activation",
    "ELU": "activation", "PReLU": "activation", "ThresholdedReLU": "activation",
    "MaxPooling1D": "maxpool", "MaxPooling2D": "maxpool", "MaxPooling3D": "maxpool",
    "Pooling1D": "pool", "Pooling2D": "pool", "Pooling3D": "pool",
    "GlobalPooling1D": "pool", "GlobalPooling2D": "pool", "GlobalPooling3D": "pool",
    "Add": "add", "Subtract": "add", "Average": "add", "Maximum": "add", "Minimum": "add",
    "Multiply": "multiply", "Concatenate": "concat",
    "Dropout": "dropout",
    "Flatten": "reshape", "Reshape": "reshape", "ZeroPadding2D": "reshape", "ZeroPadding1D": "reshape",
    "Cropping2D": "reshape", "Permute": "reshape", "Rescaling": "reshape", "Normalization": "reshape",
    "Resizing": "reshape",
}


@dataclass
class KerasOp:
    """One call of a leaf layer in the flattened functional graph."""

    name: str
    layer: Any
    node: Any  # tf_keras Node, or None for a model input
    input_ids: tuple[str, ...]  # resolved ids of the Keras tensors it reads
    output_ids: tuple[str, ...]
    output_shapes: tuple[tuple[int | None, ...], ...]
    output_dtype_bytes: tuple[int, ...]


@dataclass
class FlatModel:
    ops: list[KerasOp]
    input_ids: list[str]
    output_ids: list[str]
    alias: dict[str, str]  # inner nested-model tensor id -> id it stands for

    def resolve(self, tensor_id: str) -> str:
        while tensor_id in self.alias:
            tensor_id = self.alias[tensor_id]
        return tensor_id


def _is_functional(layer: Any) -> bool:
    return (
        hasattr(layer, "_nodes_by_depth") and hasattr(layer, "_network_nodes") and bool(getattr(layer, "inputs", None))
    )


def layer_kind(layer: Any) -> str:
    for cls in type(layer).__mro__:
        kind = _KIND_BY_CLASS.get(cls.__name__)
        if kind:
            return kind
    return "other"


def _tensor_info(kts: list[Any]) -> tuple[tuple[tuple[int | None, ...], ...], tuple[int, ...]]:
    shapes = tuple(tuple(kt.shape.as_list()) for kt in kts)
    sizes = tuple(kt.dtype.size for kt in kts)
    return shapes, sizes


def flatten_model(model: Any) -> FlatModel:
    """Leaf layer calls of `model` in topological order, nested functional models expanded."""
    if not _is_functional(model):
        raise MemoryPlanError(f"Model {getattr(model, 'name', model)!r} is not a functional Keras model.",
                              hint="build it with keras.Input(...) and the functional API (or a built Sequential).")
    flat = FlatModel([], [], [], {})
    for kt in model.inputs:
        kid = str(id(kt))
        shapes, sizes = _tensor_info([kt])
        flat.ops.append(KerasOp(kt._keras_history.layer.name, kt._keras_history.layer, None, (), (kid,), shapes, sizes))
        flat.input_ids.append(kid)
    _walk(model, flat, prefix="")
    flat.output_ids = [flat.resolve(str(id(kt))) for kt in model.outputs]
    names = [op.name for op in flat.ops]
    if len(set(names)) != len(names):
        raise MemoryPlanError(
            "Two layer calls of the model share a name (a layer is reused).",
            hint="the memory scheduler needs each layer called once; give shared layers distinct copies.",
        )
    return flat


def _walk(model: Any, flat: FlatModel, prefix: str) -> None:
    for depth in sorted(model._nodes_by_depth, reverse=True):
        for node in model._nodes_by_depth[depth]:
            if node.is_input:
                continue
            layer = node.layer
            in_ids = [str(id(kt)) for kt in node.keras_inputs]
            out_kts = tf_nest_flatten(node.outputs)
            out_ids = [str(id(kt)) for kt in out_kts]
            if _is_functional(layer):
                for inner_kt, outer_id in zip(layer.inputs, in_ids):
                    flat.alias[str(id(inner_kt))] = outer_id
                _walk(layer, flat, prefix=f"{prefix}{layer.name}/")
                for outer_id, inner_kt in zip(out_ids, layer.outputs):
                    flat.alias[outer_id] = str(id(inner_kt))
                continue
            shapes, sizes = _tensor_info(out_kts)
            flat.ops.append(KerasOp(prefix + layer.name, layer, node, tuple(flat.resolve(i) for i in in_ids),
                                    tuple(out_ids), shapes, sizes))


def tf_nest_flatten(x: Any) -> list[Any]:
    import tensorflow as tf

    return list(tf.nest.flatten(x))


def _elems(shape: tuple[int | None, ...], batch_size: int) -> int:
    dims = [batch_size if d is None else d for d in shape]
    return int(math.prod(dims)) if dims else 1


def _flops(op: KerasOp, kind: str, batch_size: int, in_elems: int) -> float:
    out_elems = sum(_elems(s, batch_size) for s in op.output_shapes)
    layer = op.layer
    if kind in ("conv", "depthwise", "dense"):
        kernels = [w for w in layer.weights if "kernel" in w.name]
        last = op.output_shapes[0][-1] or 1
        return 2.0 * out_elems / last * sum(math.prod(w.shape.as_list()) for w in kernels)
    if kind == "bn":
        return 8.0 * out_elems
    if kind in ("activation", "dropout"):
        return 2.0 * out_elems
    if kind == "maxpool" or kind == "pool":
        size = getattr(layer, "pool_size", None)
        return float(out_elems * math.prod(size)) if size else float(in_elems)
    if kind in ("add", "multiply"):
        return float(out_elems * max(1, len(op.input_ids) - 1))
    if kind == "concat":
        return float(out_elems)
    return 0.0


def extract_graph(model: Any, batch_size: int) -> LayerGraph:
    """The `LayerGraph` of a tf_keras functional model at `batch_size`."""
    flat = flatten_model(model)
    producer: dict[str, str] = {}
    for op in flat.ops:
        for oid in op.output_ids:
            producer[oid] = op.name
    nodes = []
    out_bytes_by_name: dict[str, int] = {}
    for op in flat.ops:
        kind = layer_kind(op.layer) if op.node is not None else "input"
        inputs = tuple(dict.fromkeys(producer[i] for i in op.input_ids))
        out_bytes = sum(_elems(s, batch_size) * b for s, b in zip(op.output_shapes, op.output_dtype_bytes))
        in_elems = sum(out_bytes_by_name[p] for p in inputs) // max(1, op.output_dtype_bytes[0])
        weights = op.layer.weights if op.node is not None else []
        param_bytes = sum(w.shape.num_elements() * w.dtype.size for w in weights)
        trainable = sum(w.shape.num_elements() * w.dtype.size for w in weights if w.trainable)
        nodes.append(LayerNode(op.name, kind, inputs, int(out_bytes), int(param_bytes), int(trainable),
                               _flops(op, kind, batch_size, in_elems)))
        out_bytes_by_name[op.name] = int(out_bytes)
    dtype_bytes = flat.ops[-1].output_dtype_bytes[0] if flat.ops else 4
    return LayerGraph(tuple(nodes), batch_size, dtype_bytes, getattr(model, "name", "model"))
