"""The speech API: an HTTP server in the shape of OpenAI's (`/v1/audio/speech`, `/v1/models`,
`/v1/voices`), on FastAPI and uvicorn, in front of one engine and the voice library. A front end
beside the GUI and the CLI: it may import the engine and the library, never Qt.

`app` holds the routes, `speech` one streamed response, `gate` the engine's waiting line and
`run` the ways to run it (`serve` for `vocable serve`, `ServerThread` for the app)."""
from .app import ServerConfig, create_app
from .run import ServerThread, check_exposure, serve

__all__ = ["ServerConfig", "ServerThread", "check_exposure", "create_app", "serve"]
