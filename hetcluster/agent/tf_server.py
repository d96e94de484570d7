"""Child-process entry point: one tf.distribute.Server, and nothing else.

The agent starts this with a cluster spec, a job name and an index. It runs no code sent over the
network: models travel only inside TensorFlow's own runtime (the coordinator traces functions,
workers execute graphs). With ``--plane-fd`` (always, unless a developer opened the plane) it
first leaves the host's network for a namespace of its own (hetcluster.plane) and serves its
parent sockets there; its cluster spec then names local endpoints only. It exits when the
process that started it is gone, so a killed agent leaves no orphan servers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

from hetcluster.tfenv import prepare_tf_env


def _watch_parent(parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            os._exit(0)
        time.sleep(1.0)


def _without_keras() -> None:
    """A server runs the graphs the coordinator traced and builds no model: keep Keras out of it.

    ``import tensorflow`` imports Keras's optimizers eagerly (to register them for SavedModel
    loading, which a server never does) and ignores an ImportError there; with them come tf_keras,
    pandas and pyarrow, a quarter of a server's start (docs/decisions.md#tf-servers-without-keras).
    A None entry in sys.modules makes that import fail at once."""
    for name in ("tf_keras", "keras"):
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hetcluster.agent.tf_server")
    parser.add_argument("--cluster-spec", required=True, help="JSON: job name -> list of host:port")
    parser.add_argument("--job", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--protocol", default="grpc")
    parser.add_argument("--parent-pid", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="TF intra-op threads (0: TF default)")
    parser.add_argument("--plane-fd", type=int, default=-1, help="control socket of the training plane")
    parser.add_argument("--isolation", default="netns", help="netns, or none (the operator's explicit opt-out)")
    args = parser.parse_args(argv)
    routed = None
    if args.plane_fd >= 0:  # before any thread starts: a namespace holds only for later threads
        from hetcluster.plane.isolation import enter_plane

        routed = enter_plane(args.plane_fd, args.isolation)
    if args.parent_pid:
        threading.Thread(target=_watch_parent, args=(args.parent_pid,), daemon=True).start()
    prepare_tf_env()
    if args.threads > 0:
        # Read by TF's runtime when it sizes the intra-op pool of the functions the coordinator
        # sends (a ConfigProto on the server would not reach them). Inter-op stays at its default:
        # one inter-op thread can deadlock remote function execution.
        os.environ["TF_NUM_INTRAOP_THREADS"] = str(args.threads)
    spec = json.loads(args.cluster_spec)
    _without_keras()

    import tensorflow as tf

    if routed is not None:
        routed.wait()
    server = tf.distribute.Server(
        tf.train.ClusterSpec(spec), job_name=args.job, task_index=args.index, protocol=args.protocol, start=True
    )
    print(f"tf_server: {args.job}:{args.index} serving at {server.target}", file=sys.stderr, flush=True)
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
