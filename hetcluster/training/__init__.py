"""The training engine: TensorFlow ParameterServerStrategy + ClusterCoordinator on given servers.

Light imports only (the CLI imports this package at start-up); TensorFlow is imported inside the
functions that run training.
"""

from hetcluster.training.spec import ClusterAddresses, RunResult, TrainSpec

__all__ = ["ClusterAddresses", "RunResult", "TrainSpec"]
