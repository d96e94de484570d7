"""Throwaway credentials for a fleet: a private CA, a server and a client certificate, a token.

Made with the ``cryptography`` library so no openssl binary is needed on a device. Keys are
ECDSA P-256 (fast to make, supported by gRPC's TLS stack). Every file is written atomically and
0600: the agent reads them as its own user, and a key must never be world-readable. The CA key is
kept so more client certificates can be issued later; delete it if you will not need that.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import secrets
from dataclasses import dataclass
from pathlib import Path

from hetcluster.errors import CredentialsError
from hetcluster.fileio import write_text_atomic

log = logging.getLogger(__name__)

DEFAULT_HOSTS = ("127.0.0.1", "localhost")
SECRET_MODE = 0o600


@dataclass(frozen=True)
class CredentialPaths:
    """Where generate_credentials put each file."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    token: Path

    @classmethod
    def under(cls, out_dir: Path) -> "CredentialPaths":
        """The files generate_credentials writes in ``out_dir`` (a fleet started earlier reuses them)."""
        out = Path(out_dir)
        return cls(ca_cert=out / "ca.crt", ca_key=out / "ca.key", server_cert=out / "server.crt",
                   server_key=out / "server.key", client_cert=out / "client.crt", client_key=out / "client.key",
                   token=out / "token")


def generate_credentials(
    out_dir: Path,
    hosts: list[str] | tuple[str, ...] = DEFAULT_HOSTS,
    days: int = 365,
    *,
    client_name: str = "hetcluster-coordinator",
    overwrite: bool = True,
) -> CredentialPaths:
    """Make a CA, a server certificate valid for ``hosts`` (IPs become IP SANs), a client
    certificate and a random bearer token under ``out_dir``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if days <= 0:
        raise CredentialsError(f"certificate lifetime must be positive, got {days} days.", hint="pass --days 365.")
    host_list = [h.strip() for h in hosts if h.strip()]
    if not host_list:
        raise CredentialsError(
            "no host names for the server certificate.", hint="pass --host with the agent's address."
        )
    out = Path(out_dir)
    paths = CredentialPaths.under(out)
    if not overwrite:
        existing = [str(p) for p in vars(paths).values() if p.exists()]
        if existing:
            raise CredentialsError(
                f"credentials already exist: {', '.join(existing)}.",
                hint="pick another --out folder, or pass --force to overwrite them.",
            )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CredentialsError(
            f"cannot create {out}: {error.strerror}.", hint="choose a writable --out folder."
        ) from None

    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=days)

    def new_key() -> ec.EllipticCurvePrivateKey:
        return ec.generate_private_key(ec.SECP256R1())

    def name(common_name: str) -> x509.Name:
        return x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "hetcluster"),
                x509.NameAttribute(NameOID.COMMON_NAME, common_name),
            ]
        )

    ca_key = new_key()
    ca_name = name(f"hetcluster CA {secrets.token_hex(4)}")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(
        common_name: str, usages: list[x509.ObjectIdentifier], sans: list[x509.GeneralName]
    ) -> tuple[object, object]:
        key = new_key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(common_name))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(until)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return key, builder.sign(ca_key, hashes.SHA256())

    sans: list[x509.GeneralName] = []
    for host in host_list:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    # Both usages on both: on the training plane every host serves its own tasks over mTLS and
    # connects to the others' (hetcluster.plane.tls); the agent's gRPC port checks only the CA.
    both = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    server_key, server_cert = leaf(host_list[0], both, sans)
    client_key, client_cert = leaf(client_name, both, [])

    def pem_key(key: ec.EllipticCurvePrivateKey) -> str:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()

    def pem_cert(cert: x509.Certificate) -> str:
        return cert.public_bytes(serialization.Encoding.PEM).decode()

    contents = {
        paths.ca_cert: pem_cert(ca_cert),
        paths.ca_key: pem_key(ca_key),
        paths.server_cert: pem_cert(server_cert),  # type: ignore[arg-type]
        paths.server_key: pem_key(server_key),  # type: ignore[arg-type]
        paths.client_cert: pem_cert(client_cert),  # type: ignore[arg-type]
        paths.client_key: pem_key(client_key),  # type: ignore[arg-type]
        paths.token: secrets.token_urlsafe(32) + "\n",
    }
    try:
        for path, text in contents.items():
            write_text_atomic(path, text, mode=SECRET_MODE)
    except OSError as error:
        raise CredentialsError(
            f"cannot write credentials under {out}: {error.strerror}.", hint="choose a writable --out folder."
        ) from None
    log.info("wrote credentials for hosts %s under %s (valid %d days)", ", ".join(host_list), out, days)
    return paths


def read_secret(path: Path | str, what: str) -> bytes:
    """Read a credential file, turning OS errors into a CredentialsError that names the file."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as error:
        raise CredentialsError(
            f"cannot read {what} {file}: {error.strerror}.",
            hint="check the path and that this user may read it (hetcluster agent credentials makes the files).",
        ) from None
    if not data.strip():
        raise CredentialsError(f"{what} {file} is empty.", hint="regenerate it with hetcluster agent credentials.")
    return data


def read_token(path: Path | str) -> str:
    """The bearer token in a token file (surrounding whitespace stripped)."""
    return read_secret(path, "token file").decode("utf-8", errors="strict").strip()
