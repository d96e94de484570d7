"""A plain ``tf.distribute.Server`` process: the parameter server (or a test worker).

``python -m hetcluster.training.tf_server --cluster-spec JSON --job ps --index 0`` serves until it
is killed. It prints nothing; it writes ``READY <address>`` to ``--ready-file`` when listening so
a parent can wait without polling the port. Workers need no user code: ClusterCoordinator sends
them traced functions.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading

log = logging.getLogger(__name__)


def serve(cluster_spec: dict[str, list[str]], job: str, index: int, ready_file: str | None = None) -> None:
    """Start the server task ``job:index`` of ``cluster_spec`` and block until SIGTERM/SIGINT."""
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster_spec), job_name=job, task_index=index, protocol="grpc", start=True)
    log.info("TF server %s:%d listening on %s", job, index, server.target)
    if ready_file:
        tmp = ready_file + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(f"READY {cluster_spec[job][index]}\n")
        os.replace(tmp, ready_file)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    # tf.distribute.Server cannot be stopped cleanly in TF2; exit the process instead.
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster-spec", required=True, help="JSON {job: [host:port, ...]}")
    parser.add_argument("--job", required=True)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--ready-file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    serve(json.loads(args.cluster_spec), args.job, args.index, args.ready_file)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
