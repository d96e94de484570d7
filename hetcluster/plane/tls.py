"""TLS contexts of the training plane: mutual TLS, both ends checked against the fleet's CA.

A peer's identity is "holds a certificate from the fleet's CA", as for the agents' own gRPC
port; host names are not checked (a task's forwarding address may be any address of its host).
Certificates need both extended key usages, since each host is a TLS server for its own tasks
and a TLS client toward the others (``hetcluster agent credentials`` makes them so).
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Sequence

from hetcluster.errors import CredentialsError

HANDSHAKE_TIMEOUT_S = 10.0


def _context(
    purpose: int, cert_file: Path | str, key_file: Path | str, ca_files: Sequence[Path | str]
) -> ssl.SSLContext:
    context = ssl.SSLContext(purpose)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        context.load_cert_chain(str(cert_file), str(key_file))
        for ca in dict.fromkeys(str(c) for c in ca_files):
            context.load_verify_locations(ca)
    except (OSError, ssl.SSLError) as error:
        raise CredentialsError(f"cannot load the training plane's TLS files ({cert_file}, {key_file}, "
                               f"{', '.join(map(str, ca_files))}): {error}.",
                               hint="check the paths; `hetcluster agent credentials` makes them.") from None
    return context


def server_context(cert_file: Path | str, key_file: Path | str, ca_files: Sequence[Path | str]) -> ssl.SSLContext:
    """Accept only peers whose client certificate the CA(s) signed."""
    return _context(ssl.PROTOCOL_TLS_SERVER, cert_file, key_file, ca_files)


def client_context(cert_file: Path | str, key_file: Path | str, ca_files: Sequence[Path | str]) -> ssl.SSLContext:
    """Present our certificate; talk only to a server whose certificate the CA(s) signed."""
    return _context(ssl.PROTOCOL_TLS_CLIENT, cert_file, key_file, ca_files)
