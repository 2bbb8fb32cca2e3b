#!/usr/bin/env python3
"""Renders screenshots of the app's main states into assets/screenshots/ (the README shows them).

    .venv/bin/python tools/screenshots.py [--out assets/screenshots] [--model MODEL.gguf]

It runs the real window on Qt's offscreen platform (a virtual screen: no display needed) with a
private VOCABLE_HOME, the tiny test model (converted on the fly) or --model, and the test
reference clip, and saves: setup.png (first launch, no model), reference.png (a dropped
reference with its checks and the transcript), generating.png (speech streaming in), result.png
(the result, with the history), about.png (Help > About, on Qt's license) and dark.png (the
result with a dark palette). The tiny model speaks noise; the screenshots show the app, not a
voice.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REF = REPO / "tests" / "fixtures" / "tiny-0.6b" / "reference" / "ref_24k.wav"
TINY = REPO / "tests" / "fixtures" / "tiny-0.6b" / "model"
TEXT = ("Good evening. Tonight's story begins on a quiet street, where a small bookshop keeps its lights "
        "on long after closing time.")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "assets" / "screenshots"))
    ap.add_argument("--model", help="a converted .gguf (default: the tiny test model, converted now)")
    ap.add_argument("--size", default="1100x880", help="window size WxH")
    args = ap.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    home = Path(tempfile.mkdtemp(prefix="vocable-shots-"))
    os.environ["VOCABLE_HOME"] = str(home)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    width, height = (int(v) for v in args.size.split("x"))

    from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
    from PySide6.QtGui import QColor, QDragEnterEvent, QDropEvent, QPalette
    from PySide6.QtWidgets import QApplication

    from vocable.gui.controller import devices
    from vocable.gui.app import make_application
    from vocable.gui.controller import AudioAvailability, Controller

    # the app as on a desktop with a microphone and speakers, whatever this machine has (nothing
    # is played or recorded: the script clicks neither)
    devices.query_audio_devices = lambda: AudioAvailability(True, True, outputs=["Speakers"], inputs=["Microphone"])
    from vocable.gui.main_window import MainWindow

    app = make_application(["vocable-screenshots"])
    app.setStyle("Fusion")  # the same look wherever the script runs

    def wait(condition, timeout=120.0, what="the state to capture"):
        end = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > end:
                raise TimeoutError(f"the window did not reach {what} (last message: {window.last_error})")
            app.processEvents()
            time.sleep(0.01)

    def shot(window, name):
        for _ in range(5):
            app.processEvents()
        path = out / f"{name}.png"
        window.grab().save(str(path))
        print(path)

    window = MainWindow(Controller())
    window.resize(width, height)
    window.show()
    window.c.start()
    wait(lambda: window.c.audio_known, what="the audio devices")
    wait(lambda: window.c.model_status == "none")
    shot(window, "setup")

    model = Path(args.model) if args.model else None
    if model is None:
        from vocable.engine.convert import convert
        model = convert(TINY, home / "tiny.gguf", "f32")
    window.c.load_model(model)
    wait(lambda: window.c.model_status == "ready", what="a loaded model")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(REF))])
    pos = QPointF(width / 2, height / 2)
    QApplication.sendEvent(window, QDragEnterEvent(pos.toPoint(), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier))
    QApplication.sendEvent(window, QDropEvent(pos, Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier))
    wait(lambda: window.c.reference is not None, what="a reference")
    window.reference.transcript.setText("Okay. Yeah.")
    window.speak.text.setPlainText(TEXT)
    window.speak.language.setCurrentText("english")
    shot(window, "reference")

    window.speak.text.setPlainText(" ".join([TEXT] * 6))
    window.speak.generate_button.click()
    wait(lambda: window.c.result_player.samples.size > 24000 * 2 or not window.c.is_generating)
    shot(window, "generating")
    window.c.stop()
    wait(lambda: not window.c.is_generating)

    window.speak.text.setPlainText(TEXT)
    window.speak.advanced.setChecked(True)
    window.speak.seed.setText("7")
    window.speak.generate_button.click()
    wait(lambda: window.c.result is not None)
    window.tabs.setCurrentWidget(window.history)
    window.history.list.setCurrentRow(0)
    window.c.result_player.seek(window.c.result_player.seconds * 0.4)
    shot(window, "result")

    from vocable.gui.about_dialog import AboutDialog
    about = AboutDialog(window.c.model_license(), window)
    about.show()
    about.table.selectRow(next(row for row, c in enumerate(about.components) if c.name == "Qt"))
    shot(about, "about")
    about.close()

    dark = QPalette()
    for role, color in ((QPalette.Window, "#2b2b2b"), (QPalette.WindowText, "#e6e6e6"), (QPalette.Base, "#1e1e1e"),
                        (QPalette.AlternateBase, "#262626"), (QPalette.Text, "#e6e6e6"), (QPalette.Button, "#353535"),
                        (QPalette.ButtonText, "#e6e6e6"), (QPalette.Highlight, "#3d8ee6"),
                        (QPalette.HighlightedText, "#ffffff"), (QPalette.ToolTipBase, "#3a3a3a"),
                        (QPalette.ToolTipText, "#e6e6e6"), (QPalette.PlaceholderText, "#8a8a8a"),
                        (QPalette.Mid, "#505050")):
        dark.setColor(role, QColor(color))
    for role in (QPalette.WindowText, QPalette.Text, QPalette.ButtonText):
        dark.setColor(QPalette.Disabled, role, QColor("#7a7a7a"))
    app.setPalette(dark)
    shot(window, "dark")
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
