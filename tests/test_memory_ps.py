"""The scheduled step inside ParameterServerStrategy: an in-process cluster (1 ps + 2 workers).

The cluster runs in a child process (TF's in-process pattern: tf.distribute.Server objects on free
ports, SimpleClusterResolver, ClusterCoordinator) so its servers and the strategy's global state end
with it instead of leaking into other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def scenario() -> dict:
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras
    from test_memory_models import resnet_like

    from hetcluster.memory import plan_for_budget
    from hetcluster.memory.executor import build_train_step
    from hetcluster.memory.keras_graph import extract_graph
    from hetcluster.training.servers import free_addresses

    *worker_addresses, ps = free_addresses(3)
    spec = {"worker": worker_addresses, "ps": [ps]}
    cluster = tf.train.ClusterSpec(spec)
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)  # 2 cores: workers need threads
    servers = [tf.distribute.Server(cluster, job_name=job, task_index=i, protocol="grpc", config=config, start=True)
               for job in spec for i in range(len(spec[job]))]
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc"))
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = resnet_like(keras, blocks=2, dropout=0.2)
        optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def loss_fn(y, logits):
        return tf.nn.compute_average_loss(per_example(y, logits), global_batch_size=4)

    # the plan of the tightest device (here: the smallest achievable peak) for every worker
    plan = plan_for_budget(extract_graph(model, 4), 1)
    step = build_train_step(model, loss_fn, optimizer, plan)
    rng = np.random.RandomState(0)
    x, y = rng.randn(8, 16, 16, 3).astype("float32"), rng.randint(0, 5, size=8)
    dataset = coordinator.create_per_worker_dataset(
        lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(4).repeat())
    iterator = iter(dataset)

    @tf.function
    def worker_fn(it):
        xb, yb = next(it)
        return strategy.run(step.step_fn, args=(xb, yb))

    bn = model.get_layer("b0_bn1")
    before = bn.moving_mean.numpy().copy()
    results = [coordinator.schedule(worker_fn, args=(iterator,)) for _ in range(6)]
    coordinator.join()
    del servers
    return {"losses": [float(r.fetch()) for r in results], "iterations": int(optimizer.iterations.numpy()),
            "bn_moved": bool(not np.allclose(before, bn.moving_mean.numpy())),
            "variable_device": model.trainable_variables[0].device, "segments": len(plan.segments)}


@pytest.mark.slow
@pytest.mark.tensorflow
def test_scheduled_step_trains_under_parameter_server_strategy() -> None:
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": f"{here}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, str(Path(__file__))], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["segments"] > 0
    assert result["iterations"] == 6
    assert all(loss == loss and loss < 10 for loss in result["losses"])  # finite
    assert result["bn_moved"]
    assert "/job:ps" in result["variable_device"]


if __name__ == "__main__":
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    print(json.dumps(scenario()))
