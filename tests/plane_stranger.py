"""A stranger on the fleet's network trying to make a TF server read a file for it.

    python tests/plane_stranger.py TARGETS_JSON SECRET_PATH [--cert C --key K --ca A]

For every ``host:port`` it first tries a TCP connection; where one opens, a bare TensorFlow client
(in a process of its own, with a time limit: TF waits for an unreachable server for ever) runs
``tf.io.read_file(SECRET_PATH)`` on the task there. With ``--cert`` it is a stranger holding a
certificate from another CA: its TF client talks through a local TLS wrapper that presents that
certificate and speaks the plane's header, as a member of the fleet would. Prints one JSON object:
``{target: outcome}``, where an outcome starting with "READ" means the stranger got the file.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

IMPORT_TIMEOUT_S = 300.0    # TensorFlow's import, on a host that trains a job meanwhile
ATTEMPT_TIMEOUT_S = 10.0    # from the import's end: an open TF server answers in milliseconds
PARALLEL_ATTEMPTS = 3


def one_attempt(target: str, secret: str) -> str:
    import tensorflow as tf

    print("imported", flush=True)
    tf.config.experimental_connect_to_host(target, job_name="victim")
    with tf.device("/job:victim/replica:0/task:0/device:CPU:0"):
        return "READ " + tf.io.read_file(secret).numpy().decode(errors="replace")[:40]


def tls_wrapper(target: str, cert: str, key: str, ca: str) -> str:
    """A local plaintext port whose connections go to ``target`` over TLS with our certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # a stranger trusts anyone
    context.load_cert_chain(cert, key)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    host, port = target.rsplit(":", 1)

    def pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve() -> None:
        while True:
            inner, _ = listener.accept()
            try:
                outer = context.wrap_socket(socket.create_connection((host, int(port)), timeout=10))
                outer.settimeout(None)
                outer.sendall(b"C")  # the plane's connect header
            except (OSError, ssl.SSLError):
                inner.close()
                continue
            threading.Thread(target=pipe, args=(inner, outer), daemon=True).start()
            threading.Thread(target=pipe, args=(outer, inner), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{listener.getsockname()[1]}"


def attempt(target: str, args: argparse.Namespace) -> str:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as error:
        return f"no TCP connection: {error.strerror or error}"
    command = [sys.executable, __file__, "--one", target, args.secret]
    if args.cert:
        command += ["--cert", args.cert, "--key", args.key, "--ca", args.ca]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             env={**os.environ, "GRPC_FAIL_FAST": "use_caller", "TF_CPP_MIN_LOG_LEVEL": "3"})
    timer = threading.Timer(IMPORT_TIMEOUT_S, child.kill)
    timer.start()
    try:
        if child.stdout.readline().strip() != "imported":
            return "the TF client did not start"
        timer.cancel()
        timer = threading.Timer(ATTEMPT_TIMEOUT_S, child.kill)
        timer.start()
        lines = [line.strip() for line in child.stdout if line.strip()]
    finally:
        timer.cancel()
        child.kill()
        child.wait()
    return lines[-1] if lines else f"no answer from TensorFlow in {ATTEMPT_TIMEOUT_S:.0f} s"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("targets")
    parser.add_argument("secret")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--ca")
    args = parser.parse_args()
    if args.one:
        target = tls_wrapper(args.targets, args.cert, args.key, args.ca) if args.cert else args.targets
        try:
            print(one_attempt(target, args.secret), flush=True)
        except Exception as error:  # noqa: BLE001 - any failure is the stranger's failure
            print(f"TF refused: {type(error).__name__}: {str(error).splitlines()[0][:160]}", flush=True)
        os._exit(0)
    targets = json.loads(args.targets)
    with ThreadPoolExecutor(max_workers=PARALLEL_ATTEMPTS) as pool:
        outcomes = dict(zip(targets, pool.map(lambda t: attempt(t, args), targets)))
    print(json.dumps(outcomes))


if __name__ == "__main__":
    main()
