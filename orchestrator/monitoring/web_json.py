"""What the status page's routes and the service's own (service/http_calls.py) share: their
JSON answers (NaN and infinities as null, never cached) and the way they call the service (in
the loop's executor: the service's calls may block on its lock). Imports no Ray."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from aiohttp import web


def plain(value: Any) -> Any:
    """`value` with NaN and infinities as None: the browser's JSON.parse rejects them, and a
    diverged loss must not take the whole page down."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def json_reply(data: Any, status: int = 200) -> web.Response:
    try:  # almost always: nothing to replace, and `plain`'s walk would cost more than the encoding
        body = json.dumps(data, default=str, separators=(",", ":"), allow_nan=False)
    except ValueError:
        body = json.dumps(plain(data), default=str, separators=(",", ":"))
    return web.json_response(text=body, status=status, headers={"Cache-Control": "no-store"})


async def in_executor(fn, *args):
    """fn(*args) in the loop's executor: a source's calls may block."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def refusal_reply(err: PermissionError) -> web.Response:
    """The service's door said no: its line, with the status it carries in `args` (401, 403,
    or 503 when the audit log cannot be written)."""
    status = err.args[1] if len(err.args) > 1 and err.args[1] in (401, 403, 503) else 403
    return json_reply({"error": str(err.args[0]) if err.args else "refused"}, status=status)
