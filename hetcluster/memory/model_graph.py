"""A model's layer graph from its name: builds the tf_keras model (imports TensorFlow).

The graph is extracted at batch 1 once per (name, input shape, classes) per process and kept in
``memory.fit``'s cache, where a profile's record of it can stand in (``fit.remember_graph``), so
planning from a profile builds no model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetcluster.memory.fit import extracted_graph, remember_graph
from hetcluster.memory.graph import LayerGraph

if TYPE_CHECKING:  # pragma: no cover
    from hetcluster.models.spec import ModelSpec

DEFAULT_INPUT_SHAPE = (224, 224, 3)


def graph_of(name: str, batch_size: int, input_shape: tuple[int, int, int] = DEFAULT_INPUT_SHAPE,
             classes: int = 1000) -> LayerGraph:
    """Layer graph of model ``name`` (the registry's, or a registered config) at ``batch_size``."""
    graph = extracted_graph(name, input_shape, classes)
    if graph is None:
        from hetcluster.memory.keras_graph import extract_graph
        from hetcluster.models.registry import build_model

        graph = extract_graph(build_model(name, input_shape=input_shape, classes=classes), batch_size=1)
        remember_graph(name, input_shape, classes, graph)
    return graph.scaled(batch_size)


def spec_graph(spec: "ModelSpec") -> LayerGraph:
    """The batch-1 layer graph of a job's model."""
    return graph_of(spec.name, 1, spec.input_shape, spec.classes)
