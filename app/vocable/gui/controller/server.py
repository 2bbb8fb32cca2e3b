"""The speech API while the app runs (Settings > Speech API): on 127.0.0.1 only, in front of the
app's own model and voice library, so other programs on this machine speak in the user's voices."""
from __future__ import annotations

import logging

log = logging.getLogger("vocable.gui")


class ServerActions:
    """The controller's `api_server` (a running server.ServerThread, or None) and its address."""

    api_server = None

    @property
    def api_address(self) -> str:
        """The API's address while it runs, else ''."""
        return self.api_server.url if self.api_server is not None else ""

    def apply_api_setting(self) -> None:
        """Starts or stops the API as the settings say (and moves it when the port changed)."""
        wanted = self.settings.api_server
        running = self.api_server
        if running is not None and (not wanted or running.port != self.settings.api_port):
            self.stop_api_server()
        if wanted and self.api_server is None:
            self._start_api_server()

    def _start_api_server(self) -> None:
        from ...errors import VocableError
        from ...server import ServerConfig, ServerThread

        try:
            self.api_server = ServerThread(lambda: self.engine, ServerConfig(port=self.settings.api_port),
                                           self.library).start()
        except VocableError as e:
            self.api_server = None
            self.error.emit("Cannot start the speech API", str(e))
        else:
            self.status.emit(f"speech API at {self.api_server.url}")
        self.api_server_changed.emit(self.api_address)

    def stop_api_server(self) -> None:
        if self.api_server is not None:
            self.api_server.stop()
            self.api_server = None
            self.api_server_changed.emit("")
