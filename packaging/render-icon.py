"""Renders assets/icons/vocable.svg to assets/icons/vocable.png (256 px) with QtSvg, and the same
PNG into the package (app/vocable/data/icons/, the window icon of an installed app).

    QT_QPA_PLATFORM=offscreen .venv/bin/python packaging/render-icon.py [SIZE]

The PNG is committed (the bundle's icon on Windows and macOS, the desktop entry's on Linux), so
this runs only when the SVG changes."""
import sys
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

ROOT = Path(__file__).resolve().parent.parent
ICONS = ROOT / "assets" / "icons"
PACKAGE_ICONS = ROOT / "app" / "vocable" / "data" / "icons"


def main() -> int:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841 (QPainter wants one)
    renderer = QSvgRenderer(str(ICONS / "vocable.svg"))
    if not renderer.isValid():
        print("render-icon: cannot read vocable.svg", file=sys.stderr)
        return 1
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    for out in (ICONS / "vocable.png", PACKAGE_ICONS / "vocable.png"):
        if not image.save(str(out), "PNG"):
            print(f"render-icon: cannot write {out}", file=sys.stderr)
            return 1
        print(f"{out} ({size} px)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
