"""One speech response: the synthesis' chunks, sped up or slowed down, encoded and sent as they
come, as plain audio or as server-sent events; a client that goes away cancels the synthesis at
once, not when the next chunk fails to send. The synthesis runs ahead of a client that reads
slowly (a player reading at the pace of playback), so the engine's turn ends with the synthesis,
not with the last byte sent; a client that stops reading altogether is cut off after a timeout."""
from __future__ import annotations

import base64
import json
import logging
import threading
import time
from typing import Callable

import anyio
from starlette.responses import Response

from ..audio.encoding import StreamEncoder
from ..audio.tempo import TempoStretch
from ..engine import Synthesis

log = logging.getLogger("vocable.server")


class SpeechBody:
    """The bytes of a response, pulled one piece at a time on a worker thread (next_bytes)."""

    def __init__(self, synthesis: Synthesis, fmt: str, speed: float, sse: bool, input_tokens: int):
        self.synthesis = synthesis
        self._chunks = synthesis.chunks()
        self._encoder = StreamEncoder(fmt, synthesis.sample_rate)
        self._stretch = TempoStretch(speed, synthesis.sample_rate)
        self.sse = sse
        self._input_tokens = input_tokens
        self._lock = threading.Lock()       # one pull at a time; close() waits for the last one
        self._ended = False
        self._first_chunk = None
        self.audio_seconds = 0.0

    def start(self) -> None:
        """Waits for the first chunk, so that a request that fails at once gets an error status
        rather than a broken stream."""
        self._first_chunk = next(self._chunks, None)

    def next_bytes(self) -> bytes | None:
        """The next piece (maybe empty), None at the end. Raises the synthesis' error."""
        with self._lock:
            if self._ended:
                return None
            if self._first_chunk is not None:
                chunk, self._first_chunk = self._first_chunk, None
            else:
                chunk = next(self._chunks, None)
            if chunk is None:
                self._ended = True
                data = self._encoder.feed(self._stretch.finish()) + self._encoder.finish()
                return self._event(data) + (self._done_event() if self.sse else b"")
            self.audio_seconds += chunk.audio.size / self.synthesis.sample_rate
            return self._event(self._encoder.feed(self._stretch.feed(chunk.audio)))

    def _event(self, data: bytes) -> bytes:
        if not self.sse or not data:
            return data
        return b"data: " + json.dumps({"type": "speech.audio.delta",
                                       "audio": base64.b64encode(data).decode("ascii")}).encode() + b"\n\n"

    def _done_event(self) -> bytes:
        frames = self.synthesis.progress.frames
        usage = {"input_tokens": self._input_tokens, "output_tokens": frames,
                 "total_tokens": self._input_tokens + frames}
        return b"data: " + json.dumps({"type": "speech.audio.done", "usage": usage}).encode() + b"\n\n"

    def error_event(self, message: str) -> bytes:
        return b"data: " + json.dumps({"type": "error", "error": {"message": message, "type": "server_error"}}
                                      ).encode() + b"\n\n"

    def cancel(self) -> None:
        self.synthesis.cancel()

    def close(self) -> None:
        """Stops the synthesis (if still running), waits for it and frees the encoder."""
        self.synthesis.close()
        with self._lock:
            self._encoder.close()


class SpeechStream(Response):
    """An ASGI response for a SpeechBody. `on_synthesized()` runs once the synthesis has ended (or
    the response is over, if that comes first), `on_close(outcome)` once the response is over,
    whatever happened ("complete", "disconnected", "stalled": no send went through for
    `send_timeout` seconds, or "failed"). Starlette's StreamingResponse would notice a client gone
    only at its next send, a chunk later; this one listens for it while it waits."""

    def __init__(self, body: SpeechBody, headers: dict[str, str], on_synthesized: Callable[[], None],
                 on_close: Callable[[str], None], send_timeout: float):
        self.status_code = 200
        self.background = None
        self._body = body
        self._headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self._on_synthesized = on_synthesized
        self._on_close = on_close
        self._send_timeout = send_timeout
        self.disconnected_at: float | None = None
        self._complete = False

    async def __call__(self, scope, receive, send) -> None:
        outcome = "failed"
        try:
            async with anyio.create_task_group() as group:
                async def watch_disconnect() -> None:
                    while True:
                        message = await receive()
                        if message["type"] == "http.disconnect":
                            if self._complete:   # the client closing after the whole response
                                return
                            self.disconnected_at = time.perf_counter()
                            self._body.cancel()        # the engine stops within a frame
                            group.cancel_scope.cancel()
                            return

                async def watch_synthesis() -> None:
                    await anyio.to_thread.run_sync(self._body.synthesis.wait, abandon_on_cancel=True)
                    self._on_synthesized()

                group.start_soon(watch_disconnect)
                group.start_soon(watch_synthesis)
                outcome = await self._send_all(send)
                group.cancel_scope.cancel()
        except OSError:   # the socket went away under a send
            pass
        finally:
            if self.disconnected_at is not None and outcome != "complete":
                outcome = "disconnected"
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._body.close)
            self._on_synthesized()
            self._on_close(outcome)

    async def _send_all(self, send) -> str:
        try:
            return await self._send_pieces(send)
        except TimeoutError:   # the client stopped reading: its socket's buffers stayed full
            self._body.cancel()
            return "stalled"

    async def _send(self, send, message: dict) -> None:
        with anyio.fail_after(self._send_timeout):
            await send(message)

    async def _send_pieces(self, send) -> str:
        await self._send(send, {"type": "http.response.start", "status": 200, "headers": self._headers})
        while True:
            try:
                data = await anyio.to_thread.run_sync(self._body.next_bytes, abandon_on_cancel=True)
            except Exception as e:  # the engine failed mid-stream: the status is sent already
                log.error("synthesis failed mid-stream: %s", e)
                if self._body.sse:
                    await self._send(send, {"type": "http.response.body", "body": self._body.error_event(str(e)),
                                            "more_body": False})
                # otherwise the response ends without its last chunk: the client sees it cut short
                return "failed"
            if data is None:
                self._complete = True
                await self._send(send, {"type": "http.response.body", "body": b"", "more_body": False})
                return "complete"
            if data:
                await self._send(send, {"type": "http.response.body", "body": data, "more_body": True})
