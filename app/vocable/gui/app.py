"""Starting the app: logging into the log folder, the QApplication (high-DPI, the system's light
or dark palette), the main window, and `--selftest`.

    vocable                              # opens the window
    vocable gui --selftest MODEL REF     # one clone through the window's own code path, then exit

The selftest loads MODEL, drops REF on the window as a user would, types a sentence, clicks
Generate, waits for the result, saves it (--out, default vocable-selftest.wav) and exits 0; any
error is printed and it exits 1 (used to check bundles, where no audio device may exist).
"""
from __future__ import annotations

import logging
import logging.handlers
import sys
import traceback
from pathlib import Path

APP_ICON = Path(__file__).resolve().parent.parent / "data" / "icons" / "vocable.png"

log = logging.getLogger("vocable.gui")

SELFTEST_TEXT = "Hello, this is a test of Vocable."
SELFTEST_TIMEOUT_S = 900
INSTALLED_MODEL = "installed"   # --selftest's MODEL for "the one the app finds at start"


def setup_logging(verbose: bool = False) -> Path | None:
    """Logs to <log folder>/vocable.log (rotated) and warnings to stderr; returns the log file."""
    from ..library.paths import log_dir

    root = logging.getLogger()
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    path = None
    try:
        path = log_dir() / "vocable.log"
        handler = logging.handlers.RotatingFileHandler(path, maxBytes=2 * 2**20, backupCount=3, encoding="utf-8")
        handler.setFormatter(fmt)
        root.addHandler(handler)
    except OSError as e:
        print(f"vocable: cannot write the log ({e}); logging to the terminal only", file=sys.stderr)
    console = logging.StreamHandler()
    console.setLevel(logging.INFO if verbose else logging.WARNING)
    console.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    root.addHandler(console)
    return path


def _install_excepthook(get_window, on_error=None) -> None:
    """An exception escaping a Qt slot is logged and shown; the app goes on (a selftest fails)."""
    def hook(kind, value, tb):
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, value, tb)
            return
        log.error("unexpected error:\n%s", "".join(traceback.format_exception(kind, value, tb)))
        window = get_window()
        if window is not None:
            window.show_error("Unexpected error", f"{kind.__name__}: {value} (details in the log)")
        if on_error is not None:
            on_error(f"{kind.__name__}: {value}")
    sys.excepthook = hook


def _qt_messages(mode, context, message) -> None:
    from PySide6.QtCore import QtMsgType
    level = {QtMsgType.QtDebugMsg: logging.DEBUG, QtMsgType.QtInfoMsg: logging.INFO,
             QtMsgType.QtWarningMsg: logging.WARNING}.get(mode, logging.ERROR)
    logging.getLogger("vocable.qt").log(level, "%s", message)


def make_application(argv: list[str] | None = None):
    """The QApplication (made once): high-DPI without rounding, the platform's own style and
    palette (light or dark as the system is)."""
    from PySide6.QtCore import Qt, qInstallMessageHandler
    from PySide6.QtGui import QGuiApplication, QIcon
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    if app is not None:
        return app
    QGuiApplication.setHighDpiScaleFactorRoundingPolicy(Qt.HighDpiScaleFactorRoundingPolicy.PassThrough)
    qInstallMessageHandler(_qt_messages)
    app = QApplication(list(argv or sys.argv[:1]))
    app.setApplicationName("Vocable")
    app.setApplicationDisplayName("Vocable")
    app.setOrganizationName("Vocable")
    app.setDesktopFileName("vocable")
    app.setWindowIcon(QIcon(str(APP_ICON)))
    return app


def run(argv: list[str] | None = None, selftest: tuple[str, str] | None = None, out: str | None = None,
        text: str | None = None, verbose: bool = False) -> int:
    """Opens the main window and runs until it closes; with `selftest` (model, reference audio)
    runs one clone and returns 0 or 1."""
    log_file = setup_logging(verbose)
    log.info("starting Vocable (log: %s)", log_file)
    app = make_application(argv)
    from .controller import Controller
    from .main_window import MainWindow

    holder: dict = {}
    _install_excepthook(lambda: holder.get("window"),
                        lambda message: holder["selftest"]._fail(message) if "selftest" in holder else None)
    try:
        controller = Controller()
    except Exception as e:  # e.g. a data folder that cannot be created
        log.exception("cannot start")
        print(f"vocable: error: cannot start: {e}", file=sys.stderr)
        return 1
    if selftest is not None:
        controller.persist_settings = False
    window = MainWindow(controller)
    holder["window"] = window
    window.show()
    if selftest is None:
        controller.start()
        return app.exec()
    model = None if selftest[0] == INSTALLED_MODEL else Path(selftest[0])
    test = SelfTest(window, model, Path(selftest[1]), Path(out or "vocable-selftest.wav"), text or SELFTEST_TEXT)
    holder["selftest"] = test
    test.begin()
    app.exec()
    return test.exit_code


class SelfTest:
    """Drives the window like a user: model, reference drop, text, Generate click, save.
    Without a model path, the app starts as it does for a user (the model in the settings, else
    the first in the models folder) and the test fails if it finds none."""

    def __init__(self, window, model: Path | None, reference: Path, out: Path, text: str):
        from PySide6.QtCore import QTimer
        self.w, self.c = window, window.c
        self.model, self.reference, self.out, self.text = model, reference, out, text
        self.exit_code = 1
        self._stage = "model"
        self._timer = QTimer()
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(lambda: self._fail(f"no result within {SELFTEST_TIMEOUT_S} s"))

    def _say(self, text: str) -> None:
        print(f"selftest: {text}", file=sys.stderr, flush=True)

    def begin(self) -> None:
        c = self.c
        c.error.connect(lambda title, message: self._fail(f"{title}: {message}"))
        c.model_state.connect(self._model_state)
        c.reference_changed.connect(self._reference_ready)
        c.result_ready.connect(self._result)
        self._timer.start(SELFTEST_TIMEOUT_S * 1000)
        for path, what in ((self.model, "model"), (self.reference, "reference audio")):
            if path is not None and not path.is_file():
                self._fail(f"{what} not found: {path}")
                return
        from PySide6.QtGui import QGuiApplication
        self._say(f"Qt platform: {QGuiApplication.platformName()}")
        c.refresh_audio(wait=True)
        if self.model is None:
            from ..library.paths import models_dir
            self._say(f"starting as the app does (models folder: {models_dir()})")
            c.start()
            return
        self._say(f"loading {self.model}")
        c.load_model(self.model)

    def _model_state(self, state: str, text: str) -> None:
        if self._stage == "model" and state == "none":
            from ..library.paths import models_dir
            self._fail(f"no model installed: the models folder {models_dir()} has none and the settings name none")
        if self._stage == "model" and state == "ready":
            self._stage = "reference"
            self._say(f"model ready: {text}; dropping {self.reference.name} on the window")
            from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
            from PySide6.QtGui import QDragEnterEvent, QDropEvent
            from PySide6.QtWidgets import QApplication
            mime = QMimeData()
            mime.setUrls([QUrl.fromLocalFile(str(self.reference.resolve()))])
            pos = QPointF(self.w.width() / 2, self.w.height() / 2)
            enter = QDragEnterEvent(pos.toPoint(), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
            QApplication.sendEvent(self.w, enter)
            QApplication.sendEvent(self.w, QDropEvent(pos, Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier))

    def _reference_ready(self) -> None:
        if self._stage != "reference" or self.c.reference is None:
            return
        self._stage = "generate"
        for warning in self.c.reference.warnings:
            self._say(f"reference warning: {warning}")
        self.w.speak.text.setPlainText(self.text)
        self._say(f"clicking Generate ({self.c.clone_mode()[0]})")
        self.w.speak.generate_button.click()

    def _result(self, result) -> None:
        if self._stage != "generate" or result is None:
            return
        self._stage = "save"
        self._say(f"{result.seconds:.2f} s of audio, first audio after {result.time_to_first_audio:.2f} s, "
                  f"real-time factor {result.real_time_factor:.2f}, {result.mode}")
        self.c.saved.connect(self._saved)
        self.c.save_result(self.out)   # on a worker; an error fails the test

    def _saved(self, files) -> None:
        if self._stage != "save":
            return
        self._say(f"saved {files[0]}")
        from PySide6.QtCore import QTimer

        from .clip_player import PLAYING, STOPPED
        player = self.c.result_player
        if player.state != PLAYING:
            self._finish(0)
            return
        self._stage = "playing"  # as after a click: the speech plays to its end
        self._say("waiting for the playback to end")
        player.state_changed.connect(lambda state: state == STOPPED and self._finish(0))
        QTimer.singleShot(int(1000 * (player.seconds + 10)), lambda: self._finish(0))

    def _fail(self, message: str) -> None:
        if self._stage == "done":
            return
        print(f"selftest: error: {message}", file=sys.stderr, flush=True)
        self._finish(1)

    def _finish(self, code: int) -> None:
        from PySide6.QtCore import QTimer
        if self._stage == "done":
            return
        self._stage = "done"
        self.exit_code = code
        self._timer.stop()
        QTimer.singleShot(0, self.w.close)
        QTimer.singleShot(0, lambda: __import__("PySide6.QtWidgets").QtWidgets.QApplication.instance().quit())


def main(argv: list[str] | None = None) -> int:
    """`python -m vocable.gui.app`: the window."""
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
