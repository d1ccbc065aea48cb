"""Bearer tokens for the TCP listener, and the namespaces each token may use.

One interceptor checks every method.  ``auth_token_file`` holds either one
token, which may use every namespace, or a TOML file mapping tokens to the
namespaces they may use (``auth_tokens_file``, its older name, is taken too)::

    [tokens]
    "token-of-tenant-a-0123456789" = ["tenant-a"]
    "operator-token-0123456789ab" = ["*"]          # every namespace

A call with a restricted token reaches the servicer with a context whose
``namespaces`` is the set it may use (``namespaces_of``); unix-socket calls
and unrestricted tokens carry none, meaning every namespace.
"""

from __future__ import annotations

import hmac
import tomllib

import grpc

from ..contract.errors import InvalidArgument, PermissionDenied

MIN_TOKEN_CHARS = 16
ALL = "*"
SCOPED_SERVICES = ("/kvstore.v1.KVStore/", "/kvstore.v1.KVStoreAdmin/")

Namespaces = frozenset[str] | None  # None: every namespace


def namespaces_of(context) -> Namespaces:
    """The namespaces the caller may use; None for every namespace."""
    return getattr(context, "namespaces", None)


def check_namespace(context, namespace: str) -> None:
    """PERMISSION_DENIED unless the caller may use ``namespace``."""
    allowed = namespaces_of(context)
    if allowed is not None and namespace not in allowed:
        raise PermissionDenied(f"namespace: this token may not use namespace {namespace!r}")


def read_auth_token_file(path: str, key: str = "auth_token_file") -> dict[str, Namespaces]:
    """``{token: namespaces}`` from ``path``: one token (every namespace) or a TOML ``[tokens]`` table."""
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError as exc:
        raise InvalidArgument(key, f"cannot read {path}: {exc.strerror}") from None
    token = text.strip()
    if not any(c.isspace() for c in token):  # one line, one word: a token (base64 ones end in =)
        _check_token(token, key, path)
        return {token: None}
    try:
        table = tomllib.loads(text).get("tokens")
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(key, f"{path} is neither one token nor a valid TOML [tokens] table: {exc}") from None
    return _token_table(table, key, path)


def _token_table(table, key: str, path: str) -> dict[str, Namespaces]:
    """``{token: namespaces}`` of a ``[tokens]`` table (see the module docstring)."""
    if not isinstance(table, dict) or not table:
        raise InvalidArgument(key, f"{path} needs a [tokens] table mapping each token to a list of namespaces")
    tokens: dict[str, Namespaces] = {}
    for token, names in table.items():
        _check_token(token, key, path)
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise InvalidArgument(key, f"{path}: the namespaces of a token must be a list of strings")
        tokens[token] = None if ALL in names else frozenset(names)
    return tokens


def _check_token(token: str, key: str, path: str) -> None:
    if len(token) < MIN_TOKEN_CHARS:
        raise InvalidArgument(key, f"a bearer token in {path} is shorter than {MIN_TOKEN_CHARS} characters")


class _ScopedContext:
    """The call's context with the namespaces its token may use."""

    def __init__(self, context, namespaces: frozenset[str]):
        self._context = context
        self.namespaces = namespaces

    def __getattr__(self, name):
        return getattr(self._context, name)


def _deny(message: str):
    async def handler(request_or_iterator, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return handler


def _rewrap(handler, behavior):
    """A handler of ``handler``'s kind and serializers running ``behavior``."""
    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return make(behavior, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)


def _scoped(handler, namespaces: frozenset[str]):
    inner = handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
    if handler.response_streaming:

        async def behavior(request, context):
            async for msg in inner(request, _ScopedContext(context, namespaces)):
                yield msg

    else:

        async def behavior(request, context):
            return await inner(request, _ScopedContext(context, namespaces))

    return _rewrap(handler, behavior)


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, tokens: dict[str, Namespaces]):
        self._tokens = [(t.encode(), names) for t, names in tokens.items()]

    def _lookup(self, metadata) -> tuple[bool, Namespaces]:
        """(the call carries a known token, the namespaces it may use)."""
        for key, value in metadata:
            if key == "authorization":
                scheme, _, given = str(value).partition(" ")
                given_b = given.strip().encode()
                matches = [names for token, names in self._tokens if hmac.compare_digest(given_b, token)]
                if scheme.lower() == "bearer" and matches:
                    return True, matches[0]
                return False, None
        return False, None

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        known, namespaces = self._lookup(handler_call_details.invocation_metadata or ())
        if not known:
            return _rewrap(handler, _deny("missing or invalid bearer token"))
        if namespaces is None or not handler_call_details.method.startswith(SCOPED_SERVICES):
            return handler
        return _scoped(handler, namespaces)
