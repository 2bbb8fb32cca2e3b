"""Running the API: `serve()` for the command line (until Ctrl-C), `ServerThread` for the app (in
the background, stopped with the window). Both bind the socket first, so a port in use or an
address that is not this machine's is a clear error, not a log line in a thread."""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import threading
import time

from ..errors import VocableError
from ..library.voices import VoiceLibrary
from .app import ServerConfig, create_app

log = logging.getLogger("vocable.server")

MIN_KEY_CHARS = 16


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(config: ServerConfig) -> None:
    """Nothing outside the machine reaches the API without a key: VocableError otherwise."""
    if config.api_key is not None and len(config.api_key) < MIN_KEY_CHARS:
        raise VocableError(f"the API key is {len(config.api_key)} characters long; use at least {MIN_KEY_CHARS} "
                           "(for example: python -c 'import secrets; print(secrets.token_urlsafe(24))')")
    if not is_loopback(config.host) and config.api_key is None:
        raise VocableError(f"listening on {config.host} lets other machines in: give an API key "
                           "(--api-key or VOCABLE_API_KEY), or listen on 127.0.0.1")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, or VocableError saying why not."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise VocableError(f"cannot listen on {host}: {e.strerror}") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        reason = "the port is in use (another server?)" if e.errno in (98, 48, 10048) else e.strerror or str(e)
        raise VocableError(f"cannot listen on {host}:{port}: {reason}") from None
    sock.setblocking(False)
    return sock


def _server(engine_source, library: VoiceLibrary, config: ServerConfig):
    import uvicorn

    app = create_app(engine_source, library, config)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="off",
                                           timeout_graceful_shutdown=3))
    return app, server


def url_of(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/v1"


def serve(engine, config: ServerConfig, library: VoiceLibrary | None = None) -> None:
    """Serves until interrupted (Ctrl-C)."""
    check_exposure(config)
    sock = bind(config.host, config.port)
    port = sock.getsockname()[1]
    _, server = _server(lambda: engine, library or VoiceLibrary(), config)
    log.warning("the speech API is at %s (Ctrl-C stops it)", url_of(config.host, port))
    server.run(sockets=[sock])


class ServerThread:
    """The API on a background thread, for the app: start() binds (VocableError when it cannot),
    stop() ends it and waits. `engine_source()` gives the engine at each request, so the server
    follows the app's model."""

    def __init__(self, engine_source, config: ServerConfig, library: VoiceLibrary | None = None):
        check_exposure(config)
        self._engine_source = engine_source
        self._config = config
        self._library = library or VoiceLibrary()
        self._thread: threading.Thread | None = None
        self.app = None
        self._server = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        return url_of(self._config.host, self.port)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> "ServerThread":
        sock = bind(self._config.host, self._config.port)
        self.port = sock.getsockname()[1]
        self.app, self._server = _server(self._engine_source, self._library, self._config)

        def run() -> None:
            try:
                asyncio.run(self._server.serve(sockets=[sock]))   # no signal handlers off the main thread
            finally:
                sock.close()

        self._thread = threading.Thread(target=run, name="vocable-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10.0
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise VocableError("the speech API did not start (see the log)")
            time.sleep(0.01)
        log.info("the speech API is at %s", self.url)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
