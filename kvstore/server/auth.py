"""Bearer-token check for the TCP listener: one interceptor, every method."""

from __future__ import annotations

import hmac

import grpc


def _deny(message: str):
    async def handler(request_or_iterator, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return handler


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, token: str):
        if len(token) < 16:
            raise ValueError("the bearer token must be at least 16 characters")
        self._token = token.encode()

    def _authorized(self, metadata) -> bool:
        for key, value in metadata:
            if key == "authorization":
                scheme, _, token = str(value).partition(" ")
                return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._token)
        return False

    @classmethod
    def from_file(cls, path: str) -> "BearerTokenInterceptor":
        with open(path) as fh:
            return cls(fh.read().strip())

    async def intercept_service(self, continuation, handler_call_details):
        if self._authorized(handler_call_details.invocation_metadata or ()):
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        deny = _deny("missing or invalid bearer token")
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(deny)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(deny)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(deny)
        return grpc.unary_unary_rpc_method_handler(deny)
