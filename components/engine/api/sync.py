"""``Engine.generate``: SGLang's synchronous twin of ``async_generate``, for loop-less scripts."""

from __future__ import annotations

import asyncio
from typing import Any, Iterator


class SyncGenerateMixin:
    """Runs ``async_generate`` on a private event loop; refuses to run inside a running loop
    (it would block it: use ``await engine.async_generate(...)`` there, as with SGLang)."""

    def generate(self, *args: Any, **kwargs: Any) -> dict[str, Any] | Iterator[dict[str, Any]]:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("Engine.generate() cannot run inside an event loop; "
                               "use `await engine.async_generate(...)`")
        if not kwargs.get("stream", False):
            return asyncio.run(self.async_generate(*args, **kwargs))
        return self._generate_stream(args, kwargs)

    def _generate_stream(self, args: tuple, kwargs: dict[str, Any]) -> Iterator[dict[str, Any]]:
        loop = asyncio.new_event_loop()
        try:
            stream = loop.run_until_complete(self.async_generate(*args, **kwargs))
            try:
                while True:
                    try:
                        yield loop.run_until_complete(stream.__anext__())
                    except StopAsyncIteration:
                        return
            finally:  # an abandoned iterator aborts the request, as the async one does
                loop.run_until_complete(stream.aclose())
        finally:
            loop.close()
