"""A stand-in TF process for the plane's tests: enters the plane, then echoes on its local port.

python tests/plane_child.py PORT --plane-fd N --isolation netns|none
"""

from __future__ import annotations

import argparse
import socket
import threading

from hetcluster.plane.isolation import enter_plane


def echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--plane-fd", type=int, required=True)
    parser.add_argument("--isolation", default="netns")
    args = parser.parse_args()
    routed = enter_plane(args.plane_fd, args.isolation)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", args.port))  # every interface of its namespace, as TF binds
    listener.listen()
    routed.wait()
    print("serving", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=echo, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
