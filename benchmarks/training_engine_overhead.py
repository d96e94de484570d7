"""Steps/s of hetcluster's training engine against a bare TF ParameterServerStrategy loop.

Both train small_cnn (32x32x3, batch 32, SGD momentum 0.9, synthetic data) on the same local
servers (1 PS + 2 workers, child processes, each in a namespace of its own on the training
plane), alternating, each in a fresh process that is the chief on the same plane. The bare loop
schedules 20 warm-up steps, joins, then times N steps; the engine (``run_in_subprocess``) trains
N + 20 steps with 20 warm-up steps and reports ``RunResult.steps_per_s``. Prints each pair and the
median ratio engine / bare.

    .venv/bin/python benchmarks/training_engine_overhead.py [--steps 300] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def bare_loop(cluster_spec: dict, steps: int) -> float:
    """The textbook PSS loop (tf.distribute docs); returns steps/s over ``steps`` after warm-up."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    import tensorflow as tf
    import tf_keras as keras

    from hetcluster.models.datasets import DataSource, make_dataset_fn
    from hetcluster.models.registry import build_model
    from hetcluster.models.spec import ModelSpec

    spec = ModelSpec("small_cnn", (32, 32, 3), 10, 32)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster_spec), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = build_model(spec.name, spec.input_shape, spec.classes)
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    dataset_fn = make_dataset_fn(DataSource(), spec)

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))

    @tf.function
    def step(it):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(y, model(x, training=True)))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        x, y = next(it)
        return strategy.run(replica, args=(x, y))

    for _ in range(20):
        coordinator.schedule(step, args=(iterator,))
    coordinator.join()
    start = time.perf_counter()
    for _ in range(steps):
        coordinator.schedule(step, args=(iterator,))
    coordinator.join()
    return steps / (time.perf_counter() - start)


def bare_steps_per_s(cluster, steps: int, plane) -> float:
    """The bare loop in a fresh process, the chief of ``cluster`` on ``plane`` (run_job.chief_process)."""
    import tempfile

    from hetcluster.tfenv import tf_env
    from hetcluster.training.run_job import chief_process

    seen = plane.local_view(cluster) if plane is not None else cluster
    command = [sys.executable, __file__, "--steps", str(steps), "--bare", json.dumps(seen.cluster_spec_dict())]
    with tempfile.TemporaryFile("w+") as out:
        with chief_process(plane, cluster, command, stdout=out, stderr=subprocess.DEVNULL, env=tf_env()) as process:
            if process.wait(900) != 0:
                raise RuntimeError(f"the bare loop exited with {process.returncode}")
        out.seek(0)
        return float(next(line for line in out.read().splitlines() if line.startswith("BARE")).split()[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--bare", help=argparse.SUPPRESS)  # internal: run the bare loop on this spec
    parser.add_argument("--plane-fd", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--isolation", default="netns", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare:
        if args.plane_fd >= 0:
            from hetcluster.plane.isolation import enter_plane

            enter_plane(args.plane_fd, args.isolation).wait()
        print(f"BARE {bare_loop(json.loads(args.bare), args.steps)}", flush=True)
        os._exit(0)

    from hetcluster.models.spec import ModelSpec
    from hetcluster.training.plane import CoordinatorPlane
    from hetcluster.training.run_job import run_in_subprocess
    from hetcluster.training.servers import start_local_cluster
    from hetcluster.training.spec import TrainSpec

    plane = CoordinatorPlane.local()
    cluster, servers = start_local_cluster(["w0", "w1"], None if plane.open else plane)
    ratios = []
    try:
        for rep in range(args.reps):
            bare = bare_steps_per_s(cluster, args.steps, None if plane.open else plane)
            result = run_in_subprocess(TrainSpec(model=ModelSpec("small_cnn", (32, 32, 3), 10, 32),
                                                 total_steps=args.steps + 20, warmup_steps=20), cluster, timeout_s=600,
                                       plane=None if plane.open else plane)
            ratios.append(result.steps_per_s / bare)
            print(f"rep {rep}: bare PSS loop {bare:.1f} steps/s, engine {result.steps_per_s:.1f} steps/s, "
                  f"ratio {ratios[-1]:.3f}", flush=True)
    finally:
        for server in servers:
            server.stop()
        plane.close()
    print(f"median ratio engine/bare: {statistics.median(ratios):.3f} over {len(ratios)} pairs "
          f"(small_cnn 32x32x3, batch 32, 2 workers, {args.steps} steps; load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
