"""ASGI middleware for the vLLM server: every path needs `Authorization: Bearer <key>`.

vLLM's own `--api-key` guards only /v1, /v2, /inference and /cohere: with runtime LoRA updating
on, the SageMaker routes `POST /adapters` (loads an adapter), `DELETE /adapters/{name}` and
`POST /invocations` (inference) answer without the key, and so do /metrics, /tokenize and, in
dev mode (sleep), /sleep, /wake_up, /collective_rpc. This guard refuses all of them (401, or
close code 1008 on a websocket) unless the key is sent; only `GET /health` stays open. The key
is the server's VLLM_API_KEY (random per server, in its environment, not on its command line).

Stdlib only: the server loads it from its own venv (rcgrpo.rollout.vllm_server copies this file
into the server's private folder and passes `--middleware rcgrpo_vllm_guard.BearerGuard`).

    .venv/bin/pytest tests/test_vllm_servers.py -q -k key
"""

import hashlib
import hmac
import os

OPEN = {"/health"}  # liveness, answered without the key (GET/HEAD only)


class BearerGuard:
    def __init__(self, app):
        self.app = app
        key = os.environ.get("VLLM_API_KEY", "")
        if len(key) < 16:
            raise RuntimeError("BearerGuard: VLLM_API_KEY (>= 16 characters) is not set")
        self.digest = hashlib.sha256(key.encode()).digest()

    def allowed(self, scope) -> bool:
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if scope["type"] == "http" and scope.get("method") in ("GET", "HEAD") and path in OPEN:
            return True
        headers = dict(scope.get("headers") or [])
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        given = hashlib.sha256(token.encode()).digest()
        return scheme.lower() == "bearer" and hmac.compare_digest(given, self.digest)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or self.allowed(scope):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"error": "Unauthorized"}'})
