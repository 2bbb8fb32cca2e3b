"""The HTTP API, in OpenAI's shape: POST /v1/audio/speech, GET /v1/models, GET and POST
/v1/voices. Errors are OpenAI's error JSON; requests wait their turn at the engine in a bounded
line (gate.py); the log has the request line and its timing, never the text.

The server keeps nothing of its own: voices are the library's files and the model is a file, so
several servers can run side by side behind a load balancer (README, The speech API)."""
from __future__ import annotations

import hmac
import logging
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Optional, Union

import anyio
from fastapi import Depends, FastAPI, File, Form, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..audio.encoding import MEDIA_TYPES, aac_available
from ..audio.tempo import MAX_SPEED, MIN_SPEED
from ..errors import VocableError
from ..library.voices import VoiceEntry, VoiceLibrary, check_name
from .gate import EngineGate, QueueFull
from .speech import SpeechBody, SpeechStream

log = logging.getLogger("vocable.server")

MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")   # what OpenAI clients send by default
# and their dated snapshots (tts-1-1106, gpt-4o-mini-tts-2025-12-15)
DATED_ALIAS = re.compile(r"(tts-1|tts-1-hd|gpt-4o-mini-tts)-\d{4}(-\d{2}-\d{2})?")
UPLOAD_SUFFIXES = {".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aiff", ".aif", ".w64", ".caf"}


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8765
    api_key: str | None = None
    max_input_chars: int = 4096          # OpenAI's limit
    max_upload_bytes: int = 20 << 20     # a reference clip
    max_json_bytes: int = 1 << 20
    max_waiting: int = 8                 # requests in line behind the one computing
    send_timeout: float = 60.0           # seconds a client may leave a piece of audio unread


class ApiError(Exception):
    """An answer in OpenAI's error shape."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.kind, "param": self.param,
                                       "code": self.code}}, status_code=self.status, headers=self.headers)


class VoiceId(BaseModel):
    id: str = Field(max_length=200)


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(max_length=200)
    input: str
    voice: Union[str, VoiceId]
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(1.0, ge=MIN_SPEED, le=MAX_SPEED)
    instructions: Optional[str] = Field(None, max_length=4096)   # for instruction-following models
    stream_format: Literal["audio", "sse"] = "audio"
    # Vocable's own, through the SDK's extra_body
    seed: Optional[int] = Field(None, ge=0, lt=2 ** 63)
    greedy: bool = False
    language: str = Field("auto", max_length=64)


def _voice_json(entry: VoiceEntry) -> dict:
    return {"id": entry.id, "object": "voice", "name": entry.name, "created": int(entry.created.timestamp()),
            "reference_seconds": round(entry.seconds, 2), "in_context": bool(entry.has_codes and entry.ref_text),
            "model_variant": entry.model_variant}


def _named(entries: list[VoiceEntry], name: str) -> list[VoiceEntry]:
    """The voices a request may call `name`: case and surrounding blanks do not count."""
    return [e for e in entries if e.name.casefold() == name.strip().casefold()]


def _find_voice(entries: list[VoiceEntry], wanted: str) -> VoiceEntry:
    for entry in entries:
        if entry.id == wanted:
            return entry
    named = _named(entries, wanted)
    if len(named) == 1:
        return named[0]
    known = ", ".join(sorted({e.name for e in entries})) or "none yet: add one with POST /v1/voices"
    if len(named) > 1:
        raise ApiError(400, f"several voices are named '{wanted}'; give one's id: "
                            + ", ".join(e.id for e in named), "voice", "ambiguous_voice")
    raise ApiError(400, f"unknown voice '{wanted}'; the voices are: {known}", "voice", "voice_not_found")


class _BodyLimit:
    """Refuses a request body over its limit (413) before it is read into memory. A body of
    declared length is refused from its header (the server's framing holds it to that length); a
    chunked one is read here up to the limit, then handed on."""

    def __init__(self, app, config: ServerConfig):
        self._app, self._config = app, config

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self._app(scope, receive, send)
        limit = (self._config.max_upload_bytes + (64 << 10) if scope["path"] == "/v1/voices"
                 else self._config.max_json_bytes)
        declared = dict(scope["headers"]).get(b"content-length")
        too_big = ApiError(413, f"the request body is over {limit} bytes", code="request_too_large")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await too_big.response()(scope, receive, send)
        if declared is not None:
            return await self._app(scope, receive, send)
        read: list[dict] = []
        seen = 0
        while True:
            message = await receive()
            read.append(message)
            if message["type"] != "http.request":
                break
            seen += len(message.get("body", b""))
            if seen > limit:
                return await too_big.response()(scope, receive, send)
            if not message.get("more_body", False):
                break

        async def replay():
            return read.pop(0) if read else await receive()

        await self._app(scope, replay, send)


class _RequestLog:
    """One line per request: method, path, status, milliseconds. Never the body."""

    def __init__(self, app):
        self._app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self._app(scope, receive, send)
        started, status = time.perf_counter(), 0

        async def watched_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._app(scope, receive, watched_send)
        finally:
            log.info("%s %s %s %.0f ms", scope["method"], scope["path"], status or "-",
                     1000 * (time.perf_counter() - started))


def create_app(engine_source: Callable[[], object], library: VoiceLibrary, config: ServerConfig) -> FastAPI:
    """The app for the engine that `engine_source()` returns when a request comes (None: no model
    loaded yet, 503), the voices of `library`."""
    gate = EngineGate(config.max_waiting)
    app = FastAPI(title="Vocable speech API", version="1", docs_url=None, redoc_url=None)
    app.state.gate = gate
    app.state.last_cancel_seconds = None       # disconnect to synthesis end, of the last cut stream

    def check_key(request: Request) -> None:
        if config.api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, key = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), config.api_key.encode()):
            raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")

    async def take_turn(http: Request):
        """A turn at the engine; 429 with Retry-After when the line is full; None when the client
        went away while it waited (it leaves the line, and nothing is computed for it)."""
        ticket, full = None, None
        async with anyio.create_task_group() as group:
            async def watch_disconnect() -> None:
                while (await http.receive())["type"] != "http.disconnect":
                    pass
                group.cancel_scope.cancel()

            group.start_soon(watch_disconnect)
            try:
                ticket = await gate.enter()
            except QueueFull as e:
                full = e
            group.cancel_scope.cancel()
        if full is not None:
            raise ApiError(429, str(full), code="queue_full", kind="rate_limit_error",
                           headers={"Retry-After": str(full.retry_after)})
        if ticket is None:
            log.info("%s %s: the client left while it waited for the engine", http.method, http.url.path)
        return ticket

    def current_engine():
        engine = engine_source()
        if engine is None:
            raise ApiError(503, "no model is loaded yet", code="model_not_loaded", kind="server_error")
        return engine

    def model_ids(engine) -> list[str]:
        return [Path(engine.model_path).stem, *MODEL_ALIASES]

    def serves(engine, model: str) -> bool:
        return model in model_ids(engine) or DATED_ALIAS.fullmatch(model) is not None

    def model_json(engine, model: str) -> dict:
        return {"id": model, "object": "model", "created": int(Path(engine.model_path).stat().st_mtime),
                "owned_by": "vocable"}

    @app.exception_handler(ApiError)
    async def api_error(_request, e: ApiError):
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        if first.get("type") == "json_invalid":
            return ApiError(400, "the request body is not valid JSON", code="invalid_json").response()
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return ApiError(400, f"{where or 'request'}: {first.get('msg', 'invalid request')}", where,
                        "invalid_value").response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request, e: StarletteHTTPException):
        return ApiError(e.status_code, str(e.detail), code="not_found" if e.status_code == 404 else None).response()

    @app.exception_handler(Exception)
    async def unexpected(_request, e: Exception):
        log.exception("internal error")
        return ApiError(500, "internal error; the server's log has the details", kind="server_error").response()

    @app.get("/v1/models", dependencies=[Depends(check_key)])
    async def list_models():
        engine = current_engine()
        return {"object": "list", "data": [model_json(engine, name) for name in model_ids(engine)]}

    @app.get("/v1/models/{model}", dependencies=[Depends(check_key)])
    async def retrieve_model(model: str):
        engine = current_engine()
        if not serves(engine, model):
            raise ApiError(404, f"The model '{model}' does not exist; this server has: {', '.join(model_ids(engine))}",
                           "model", "model_not_found")
        return model_json(engine, model)

    @app.get("/v1/voices", dependencies=[Depends(check_key)])
    async def list_voices():
        entries = await anyio.to_thread.run_sync(library.entries)
        return {"object": "list", "data": [_voice_json(e) for e in entries]}

    @app.post("/v1/voices", status_code=201, dependencies=[Depends(check_key)])
    async def add_voice(http: Request, name: str = Form(..., max_length=200), file: UploadFile = File(...),
                        transcript: Optional[str] = Form(None, max_length=2000)):
        engine = current_engine()
        try:
            name = check_name(name)
        except VocableError as e:
            raise ApiError(400, str(e), "name", "invalid_name") from None
        _refuse_taken_name(await anyio.to_thread.run_sync(library.entries), name)
        suffix = Path(file.filename or "").suffix.lower()
        if suffix not in UPLOAD_SUFFIXES:
            raise ApiError(400, f"the clip must be an audio file ({', '.join(sorted(UPLOAD_SUFFIXES))}), "
                                f"not '{suffix or 'no extension'}'", "file", "unsupported_file")
        data = await file.read(config.max_upload_bytes + 1)
        if len(data) > config.max_upload_bytes:
            raise ApiError(413, f"the clip is over {config.max_upload_bytes} bytes", "file", "file_too_large")
        ticket = await take_turn(http)
        if ticket is None:
            return Response(status_code=499)
        try:
            entry = await anyio.to_thread.run_sync(_embed_and_save, engine, library, data, suffix, name, transcript)
        except VocableError as e:
            raise ApiError(400, str(e), "file", "unusable_clip") from None
        finally:
            ticket.release()
        return _voice_json(entry)

    @app.post("/v1/audio/speech", dependencies=[Depends(check_key)])
    async def speech(request: SpeechRequest, http: Request):
        engine = current_engine()
        if not serves(engine, request.model):
            raise ApiError(400, f"unknown model '{request.model}'; this server has: {', '.join(model_ids(engine))}",
                           "model", "model_not_found")
        text = request.input
        if not text.strip():
            raise ApiError(400, "input is empty: give some words to speak", "input", "empty_input")
        if len(text) > config.max_input_chars:
            raise ApiError(400, f"input is {len(text)} characters long; at most {config.max_input_chars} are allowed",
                           "input", "string_above_max_length")
        if request.response_format == "aac" and not aac_available():
            raise ApiError(400, "aac needs PyAV (pip install av), which this installation lacks; use mp3, opus, "
                                "flac, wav or pcm", "response_format", "unsupported_format")
        wanted = request.voice if isinstance(request.voice, str) else request.voice.id
        entry = _find_voice(await anyio.to_thread.run_sync(library.entries), wanted)
        ticket = await take_turn(http)
        if ticket is None:
            return Response(status_code=499)
        started = time.perf_counter()
        body = None
        try:
            body = await anyio.to_thread.run_sync(_start_speech, engine, library, entry, request)
        except VocableError as e:
            ticket.release()
            raise ApiError(400, str(e), code="synthesis_failed") from None
        except BaseException:
            ticket.release()
            raise
        first_audio = time.perf_counter() - started
        stream: SpeechStream | None = None

        def finished(outcome: str) -> None:
            if outcome == "disconnected" and stream is not None and stream.disconnected_at is not None:
                app.state.last_cancel_seconds = time.perf_counter() - stream.disconnected_at
            log.info("speech: %s, %s, first audio after %.0f ms, %.2f s of audio in %.2f s", outcome,
                     request.response_format, 1000 * first_audio, body.audio_seconds, time.perf_counter() - started)

        media_type = "text/event-stream" if request.stream_format == "sse" else MEDIA_TYPES[request.response_format]
        stream = SpeechStream(body, {"Content-Type": media_type, "Cache-Control": "no-store",
                                     "X-Vocable-Seed": str(body.synthesis.seed),
                                     "X-Vocable-Mode": body.synthesis.mode}, ticket.release, finished,
                              config.send_timeout)
        return stream

    app.add_middleware(_BodyLimit, config=config)
    app.add_middleware(_RequestLog)   # added last: the outermost, it times everything
    return app


def _refuse_taken_name(entries: list[VoiceEntry], name: str) -> None:
    """409 when the library has a voice of this name: a second one would make the name ambiguous
    in every later request."""
    taken = _named(entries, name)
    if taken:
        raise ApiError(409, f"a voice named '{taken[0].name}' exists already (id {taken[0].id}); speak in it, or "
                            "choose another name", "name", "voice_exists")


def _embed_and_save(engine, library: VoiceLibrary, data: bytes, suffix: str, name: str,
                    transcript: str | None) -> VoiceEntry:
    from ..audio.files import read_reference
    from ..audio.reference import check_reference

    _refuse_taken_name(library.entries(), name)   # again, in turn: another upload may have taken it meanwhile

    with tempfile.TemporaryDirectory(prefix="vocable-upload-") as folder:
        path = Path(folder) / ("clip" + suffix)
        path.write_bytes(data)
        samples, rate, seconds = read_reference(path)
    check = check_reference(samples, rate, trim=True, source_seconds=seconds)
    voice = engine.embed_voice(check.samples, check.sample_rate, ref_text=transcript, name=name)
    return library.save(voice, name)


def _start_speech(engine, library: VoiceLibrary, entry: VoiceEntry, request: SpeechRequest) -> SpeechBody:
    voice = library.load(entry.id)
    synthesis = engine.synthesize(request.input, voice, request.language, seed=request.seed, greedy=request.greedy)
    body = None
    try:
        body = SpeechBody(synthesis, request.response_format, request.speed, request.stream_format == "sse",
                          len(engine.tokenizer.target_prompt(request.input).ids))
        body.start()
    except BaseException:
        if body is not None:
            body.close()   # the synthesis and the encoder (its pipe and thread, for mp3 and opus)
        else:
            synthesis.close()
        raise
    return body


__all__ = ["ApiError", "ServerConfig", "create_app"]
