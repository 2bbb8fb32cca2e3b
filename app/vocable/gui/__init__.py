"""Vocable's desktop app (PySide6). Qt stays in this package: it drives the engine, the audio
modules, the voice library and the history through `controller.Controller`, and runs their
work on QThreads (`workers`). Start it with `vocable` or `vocable gui`; see app.run()."""
