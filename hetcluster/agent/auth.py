"""Who may call the agent: a bearer token and/or a client certificate from our CA.

Server side, `AuthInterceptor` checks every RPC except gRPC health checking and server
reflection (so probes and grpcurl can see the agent is up). A call without a valid token is
rejected with UNAUTHENTICATED; the token is compared in constant time.

mTLS note (measured with grpcio 1.85): Python's `ssl_server_credentials(require_client_auth=False)`
maps to GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE, so the server never asks for a client
certificate and the interceptor could never see one. With a client CA configured we therefore
require and verify client certificates in the TLS handshake itself (`require_client_auth=True`):
a client without a certificate signed by that CA cannot connect at all (its calls fail with
UNAVAILABLE, "handshake failed" in the agent's log), health checks included. The interceptor
still checks that the peer presented a verified certificate, as a second line of defence.
"""

from __future__ import annotations

import hmac
import logging
from pathlib import Path
from typing import Any, Callable

import grpc

from hetcluster.agent.config import AuthConfig
from hetcluster.agent.credentials import read_secret, read_token
from hetcluster.errors import CredentialsError

log = logging.getLogger(__name__)

EXEMPT_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
AUTH_HEADER = "authorization"


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata that carries the bearer token (empty without a token)."""
    return ((AUTH_HEADER, f"Bearer {token}"),) if token else ()


class AuthInterceptor(grpc.ServerInterceptor):
    """Rejects non-exempt RPCs that lack the configured credentials with UNAUTHENTICATED."""

    def __init__(self, token: str | None, require_client_cert: bool) -> None:
        if not token and not require_client_cert:
            raise CredentialsError("an agent needs a token or mTLS.", hint="set [auth] token_file or client_ca_file.")
        self._expected = f"Bearer {token}".encode() if token else None
        self._require_client_cert = require_client_cert

    def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(EXEMPT_PREFIXES):
            return handler
        return _guard(handler, self._check, handler_call_details.method)

    def _check(self, context: grpc.ServicerContext) -> str | None:
        """None when the caller is authenticated, else the reason."""
        if self._expected is not None:
            presented = [value for key, value in context.invocation_metadata() if key == AUTH_HEADER]
            if not presented:
                return "missing bearer token"
            value = presented[0]
            value_bytes = value if isinstance(value, bytes) else str(value).encode()
            if not hmac.compare_digest(value_bytes, self._expected):
                return "invalid bearer token"
        if self._require_client_cert:
            peer = context.auth_context()
            if not peer.get("x509_pem_cert"):
                return "no verified client certificate"
        return None


def _guard(
    handler: grpc.RpcMethodHandler, check: Callable[[grpc.ServicerContext], str | None], method: str
) -> grpc.RpcMethodHandler:
    """Wrap whichever behaviour the handler has so the check runs first, with the context."""

    def refuse(context: grpc.ServicerContext) -> None:
        reason = check(context)
        if reason is not None:
            log.warning("rejected %s from %s: %s", method, context.peer(), reason)
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED, f"{reason}; present the agent's token and/or client certificate"
            )

    if handler.unary_unary:
        inner_uu = handler.unary_unary

        def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
            refuse(context)
            return inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(
            unary_unary, handler.request_deserializer, handler.response_serializer
        )
    if handler.unary_stream:
        inner_us = handler.unary_stream

        def unary_stream(request: Any, context: grpc.ServicerContext) -> Any:
            refuse(context)
            yield from inner_us(request, context)

        return grpc.unary_stream_rpc_method_handler(
            unary_stream, handler.request_deserializer, handler.response_serializer
        )
    if handler.stream_unary:
        inner_su = handler.stream_unary

        def stream_unary(requests: Any, context: grpc.ServicerContext) -> Any:
            refuse(context)
            return inner_su(requests, context)

        return grpc.stream_unary_rpc_method_handler(
            stream_unary, handler.request_deserializer, handler.response_serializer
        )
    inner_ss = handler.stream_stream

    def stream_stream(requests: Any, context: grpc.ServicerContext) -> Any:
        refuse(context)
        yield from inner_ss(requests, context)

    return grpc.stream_stream_rpc_method_handler(
        stream_stream, handler.request_deserializer, handler.response_serializer
    )


def server_credentials(auth: AuthConfig) -> grpc.ServerCredentials | None:
    """TLS credentials for the listening port, or None for a token-only (plaintext) agent."""
    if auth.cert_file is None or auth.key_file is None:
        return None
    key = read_secret(auth.key_file, "TLS key file")
    cert = read_secret(auth.cert_file, "TLS certificate file")
    client_ca = read_secret(auth.client_ca_file, "client CA file") if auth.client_ca_file else None
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def server_interceptor(auth: AuthConfig) -> AuthInterceptor:
    token = read_token(auth.token_file) if auth.token_file else None
    return AuthInterceptor(token, require_client_cert=auth.mtls)


def channel_credentials(
    ca_file: Path | str | None = None, cert_file: Path | str | None = None, key_file: Path | str | None = None
) -> grpc.ChannelCredentials:
    """TLS credentials for a client: trust ``ca_file`` (system roots when None), present a client
    certificate when ``cert_file``/``key_file`` are given (mTLS)."""
    if (cert_file is None) != (key_file is None):
        raise CredentialsError("a client certificate needs both cert_file and key_file.", hint="pass both or neither.")
    return grpc.ssl_channel_credentials(
        root_certificates=read_secret(ca_file, "CA file") if ca_file else None,
        private_key=read_secret(key_file, "client key file") if key_file else None,
        certificate_chain=read_secret(cert_file, "client certificate file") if cert_file else None,
    )
