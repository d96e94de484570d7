"""The scheduled step inside ParameterServerStrategy: an in-process cluster (1 ps + 2 workers),
one plan for every worker, and a plan per worker in the same job.

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


def per_worker_scenario() -> dict:
    """Worker 1 under conv-boundary recomputation, worker 0 under memory-centric sqrt(n) segments,
    in one traced step: each closure returns its worker's index, loss and gradients (no update, so
    every closure sees the same weights)."""
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras
    from test_memory_models import forced_plan, resnet_like

    from hetcluster.memory.executor import build_train_step, per_worker_gradients
    from hetcluster.training.servers import free_addresses

    *worker_addresses, ps = free_addresses(3)
    spec = {"worker": worker_addresses, "ps": [ps]}
    cluster = tf.train.ClusterSpec(spec)
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)
    servers = [tf.distribute.Server(cluster, job_name=job, task_index=i, protocol="grpc", config=config, start=True)
               for job in spec for i in range(len(spec[job]))]
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc"))
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    tf.keras.utils.set_random_seed(7)
    with strategy.scope():
        model = resnet_like(keras, blocks=2)
        optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def loss_fn(y, logits):
        return tf.nn.compute_average_loss(per_example(y, logits), global_batch_size=4)

    plans = [forced_plan(model, 4, "conv"), forced_plan(model, 4, "sqrt", "memory")]
    steps = [build_train_step(model, loss_fn, optimizer, plan) for plan in plans]

    def marked(b: int):
        # the loss carries which branch ran (1000 per branch index): the closure's own evidence
        def fn(x, y):
            loss, grads = steps[b].gradients_fn(x, y)
            return loss + 1000.0 * b, grads
        return fn

    variables = model.trainable_variables
    gradients = per_worker_gradients([marked(0), marked(1)], [1, 0], variables)
    rng = np.random.RandomState(0)
    x, y = rng.randn(4, 16, 16, 3).astype("float32"), rng.randint(0, 5, size=4).astype("int32")
    dataset = coordinator.create_per_worker_dataset(lambda: tf.data.Dataset.from_tensors((x, y)).repeat())
    iterator = iter(dataset)

    @tf.function
    def worker_fn(it):
        xb, yb = next(it)
        loss, grads = strategy.run(gradients, args=(xb, yb))
        return tf.distribute.coordinator.experimental_get_current_worker_index(), loss, grads

    results = []
    for _ in range(10):  # until both workers have taken closures
        batch = [coordinator.schedule(worker_fn, args=(iterator,)) for _ in range(4)]
        coordinator.join()
        results += [r.fetch() for r in batch]
        if len({int(r[0]) for r in results}) == 2:
            break
    with tf.GradientTape() as tape:  # plain Keras on the coordinator, on the same PS weights
        plain_loss = loss_fn(tf.constant(y), model(tf.constant(x), training=True))
    plain = tape.gradient(plain_loss, variables)
    del servers
    return {"workers": [int(r[0]) for r in results], "losses": [float(r[1]) for r in results],
            "plain_loss": float(plain_loss), "grads": [[g.tolist() for g in r[2]] for r in results],
            "plain_grads": [g.numpy().tolist() for g in plain],
            "techniques": [p.technique for p in plans], "segments": [len(p.segments) for p in plans]}


@pytest.mark.slow
@pytest.mark.tensorflow
def test_two_workers_run_two_plans_in_one_job_with_plain_keras_gradients() -> None:
    from test_memory_executor import _rel_err

    result = _run("--per-worker")
    assert set(result["workers"]) == {0, 1}
    assert result["segments"][0] != result["segments"][1]
    for worker, loss, grads in zip(result["workers"], result["losses"], result["grads"]):
        branch = round(loss / 1000.0)
        assert branch == 1 - worker  # worker 0 runs plan 1 (sqrt), worker 1 plan 0 (conv)
        loss -= 1000.0 * branch
        assert abs(loss - result["plain_loss"]) <= 1e-5 * abs(result["plain_loss"])
        assert _rel_err(result["plain_grads"], grads) <= 1e-5


def _run(*args: str) -> dict:
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": f"{here}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, str(Path(__file__)), *args], capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.tensorflow
def test_scheduled_step_trains_under_parameter_server_strategy() -> None:
    result = _run()
    assert result["segments"] > 0
    assert result["iterations"] == 6
    assert all(loss == loss and loss < 10 for loss in result["losses"])  # finite
    assert result["bn_moved"]
    assert "/job:ps" in result["variable_device"]


if __name__ == "__main__":
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    print(json.dumps(per_worker_scenario() if "--per-worker" in sys.argv else scenario()))
