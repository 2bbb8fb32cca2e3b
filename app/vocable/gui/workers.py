"""Work that must not run on the GUI thread: QObject workers moved to QThreads.

Each worker does one job in `work()` and reports only through signals (queued to the GUI
thread): `finished(result)`, `failed(message)` or `cancelled()`, then always `done()`. Nothing
here touches a widget. `start(worker)` runs a worker on its own QThread and cleans up after it
(as Picard's run_task and Dangerzone's startup tasks do).

    worker = SynthesisWorker(engine, request)
    worker.chunk.connect(view.append)
    worker.finished.connect(on_result)
    start(worker)
    ...
    worker.cancel()          # any thread; the synthesis stops within a frame
"""
from __future__ import annotations

import logging
import threading
import time
import traceback
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot

from ..engine import Progress
from ..errors import AudioDeviceError, SynthesisCancelled, VocableError

log = logging.getLogger("vocable.gui")


class Worker(QObject):
    """One job run off the GUI thread. Subclasses implement work(), which returns the result,
    raises (VocableError: its message is shown as is; anything else is logged with its
    traceback and reported as an internal error), or checks `self.cancel_requested`."""

    finished = Signal(object)
    failed = Signal(str)
    cancelled = Signal()
    progress = Signal(float, str)   # fraction done (0..1, negative: unknown) and what is happening
    done = Signal()                 # after finished/failed/cancelled, always

    description = "a task"

    def __init__(self):
        super().__init__()
        self._cancel = threading.Event()
        self.thread_: QThread | None = None

    @property
    def cancel_requested(self) -> bool:
        return self._cancel.is_set()

    def cancel(self) -> None:
        """Asks the job to stop (thread-safe); it ends with cancelled()."""
        self._cancel.set()

    def work(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    @Slot()
    def run(self) -> None:
        try:
            result = self.work()
        except SynthesisCancelled:
            self.cancelled.emit()
        except Exception as e:  # every error reaches the UI; none ends the app
            if self.cancel_requested and _is_cancellation(e):
                self.cancelled.emit()
            elif isinstance(e, VocableError):
                log.warning("%s failed: %s", self.description, e)
                self.failed.emit(str(e))
            else:
                log.error("%s failed:\n%s", self.description, traceback.format_exc())
                self.failed.emit(f"internal error while {self.description}: {type(e).__name__}: {e} "
                                 "(details in the log)")
        else:
            if self.cancel_requested:
                self.cancelled.emit()
            else:
                self.finished.emit(result)
        finally:
            self.done.emit()


def _is_cancellation(e: BaseException) -> bool:
    from ..engine.convert import ConversionCancelled
    return isinstance(e, (SynthesisCancelled, ConversionCancelled)) or "cancel" in type(e).__name__.lower()


class _Relay(QObject):
    """Lives on the GUI thread and calls plain Python callbacks there. Signals connected to a
    QObject's slot are queued to that object's thread; a lambda has no thread, so the worker's
    signals go through this object instead of straight to lambdas."""

    def __init__(self, finished=None, failed=None, cancelled=None, progress=None):
        super().__init__()
        self._finished, self._failed, self._cancelled, self._progress = finished, failed, cancelled, progress
        self.worker: Worker | None = None

    @Slot(object)
    def on_finished(self, result) -> None:
        if self._finished is not None:
            self._finished(result)

    @Slot(str)
    def on_failed(self, message: str) -> None:
        if self._failed is not None:
            self._failed(message)

    @Slot()
    def on_cancelled(self) -> None:
        if self._cancelled is not None:
            self._cancelled()

    @Slot(float, str)
    def on_progress(self, fraction: float, text: str) -> None:
        if self._progress is not None:
            self._progress(fraction, text)

    @Slot()
    def on_thread_finished(self) -> None:
        """Queued behind the worker's last signals, so every callback above has run."""
        worker = self.worker
        _running.pop(worker, None)
        thread, worker.thread_ = worker.thread_, None
        worker.deleteLater()
        if thread is not None:
            thread.deleteLater()


_running: dict[Worker, _Relay] = {}


def start(worker: Worker, finished: Callable[[Any], None] | None = None, failed: Callable[[str], None] | None = None,
          cancelled: Callable[[], None] | None = None,
          progress: Callable[[float, str], None] | None = None) -> Worker:
    """Runs `worker` on a new QThread; the callbacks run on the calling (GUI) thread. The thread
    quits and both are released when it is done."""
    relay = _Relay(finished, failed, cancelled, progress)
    worker.finished.connect(relay.on_finished)
    worker.failed.connect(relay.on_failed)
    worker.cancelled.connect(relay.on_cancelled)
    worker.progress.connect(relay.on_progress)
    thread = QThread()
    thread.setObjectName(f"vocable-{type(worker).__name__}")
    worker.thread_ = thread
    relay.worker = worker
    worker.moveToThread(thread)
    thread.started.connect(worker.run)
    # Direct: QThread.quit() is thread-safe, and a queued call would wait for the GUI thread's
    # event loop, which wait_all() blocks at exit: the thread then outlived the app (Qt aborts:
    # "QThread: Destroyed while thread is still running").
    worker.done.connect(thread.quit, Qt.DirectConnection)
    thread.finished.connect(relay.on_thread_finished)
    _running[worker] = relay
    thread.start()
    return worker


def running() -> list[Worker]:
    return list(_running)


def wait_all(timeout: float = 10.0) -> bool:
    """Cancels every running worker and waits for their threads (at exit)."""
    deadline = time.monotonic() + timeout
    for worker in list(_running):
        worker.cancel()
    ok = True
    for worker in list(_running):
        thread = worker.thread_
        if thread is not None:
            ok = thread.wait(max(0, int(1000 * (deadline - time.monotonic())))) and ok
    return ok


class FunctionWorker(Worker):
    """Runs fn(worker) off the GUI thread: small jobs (loading a file, a library operation)."""

    def __init__(self, fn: Callable[["FunctionWorker"], Any], description: str = "a task"):
        super().__init__()
        self._fn = fn
        self.description = description

    def work(self) -> Any:
        return self._fn(self)


class LoadModelWorker(Worker):
    """Loads a converted model: the Engine and the languages it knows."""

    description = "loading the model"

    def __init__(self, path: Path, threads: int | None, device: str = "auto"):
        super().__init__()
        self.path, self.threads, self.device = Path(path), threads, device

    def work(self):
        from ..engine import Engine
        engine = Engine(self.path, threads=self.threads, device=self.device)
        try:
            languages = engine.languages
        except Exception:
            engine.close()
            raise
        return engine, tuple(languages)


@dataclass
class SynthesisRequest:
    """What Generate asks for; `voice` is None when the reference must be embedded first."""
    text: str
    language: str = "auto"
    transcript: str | None = None
    temperature: float = 0.9
    top_k: int = 50
    seed: int | None = None
    greedy: bool = False
    voice: Any = None                       # vocable.Voice
    pending_voice: Future | None = None     # the reference's embedding still running in the background
    reference: np.ndarray | None = None     # mono float32 at reference_rate, to embed when voice is None
    reference_rate: int = 24000
    voice_name: str = ""
    play: bool = True                       # stream to the output device as chunks arrive
    output_device: str | int | None = None
    max_frames: int | None = None
    settings: dict = field(default_factory=dict)
    out_path: Path | None = None            # speak into this audio file (no playback; a long
                                            # text's segments then generate `batch` at a time)
    batch: int = 1


@dataclass
class SynthesisStats:
    """A live progress line: the stream's progress, or that the reference is being embedded."""
    stage: str                          # "embedding", "speaking", "done"
    progress: Progress | None = None    # None while embedding
    playback: str | None = None         # why playback is waiting (StreamPlayer.waiting), if it is

    def describe(self) -> str:
        if self.progress is None:
            return "embedding the reference voice..."
        return self.progress.describe() + (f"; {self.playback}" if self.playback else "")


class SynthesisWorker(Worker):
    """Embeds the reference if needed, then speaks the text: every chunk goes to the output
    device as it arrives (StreamPlayer: jitter buffer with a short pre-roll) and to `chunk`.

    Signals besides Worker's: voice_ready(Voice) after embedding, player_ready(StreamPlayer or
    None, reason) once playback is set up, chunk(np.ndarray), stats(SynthesisStats) a few times
    a second. finished(SynthesisResult). The player is handed over and keeps playing out after
    the synthesis ends; cancel() stops both at once."""

    description = "generating speech"
    voice_ready = Signal(object)
    player_ready = Signal(object, str)
    chunk = Signal(object)
    stats = Signal(object)

    STATS_INTERVAL = 0.2

    def __init__(self, engine, request: SynthesisRequest):
        super().__init__()
        self.engine = engine
        self.request = request
        self._stream = None
        self._player = None
        self._lock = threading.Lock()

    def cancel(self) -> None:
        super().cancel()
        with self._lock:
            stream, player = self._stream, self._player
        if stream is not None:
            stream.cancel()
        if player is not None:
            player.stop()

    def _wait_for(self, pending: Future):
        """The background embedding's voice, or None when it failed (then this worker embeds)."""
        while True:
            if self.cancel_requested:
                raise SynthesisCancelled("synthesis cancelled")
            try:
                return pending.result(timeout=0.05)
            except FutureTimeout:
                continue
            except Exception:  # the background embedding failed: this worker embeds and reports why
                return None

    def work(self):
        req = self.request
        voice = req.voice
        if voice is None and req.pending_voice is not None:
            self.stats.emit(SynthesisStats("embedding"))
            voice = self._wait_for(req.pending_voice)
        if voice is None:
            self.stats.emit(SynthesisStats("embedding"))
            voice = self.engine.embed_voice(req.reference, req.reference_rate, ref_text=req.transcript,
                                            name=req.voice_name)
            self.voice_ready.emit(voice)
        if self.cancel_requested:
            raise SynthesisCancelled("synthesis cancelled")
        stream = self.engine.synthesize(req.text, voice, req.language, req.transcript,
                                        temperature=req.temperature, top_k=req.top_k, seed=req.seed,
                                        greedy=req.greedy, max_frames=req.max_frames, batch=req.batch)
        with self._lock:
            self._stream = stream
        if self.cancel_requested:
            stream.cancel()
        player = self._open_player(stream.sample_rate) if req.play else None
        last = 0.0
        try:
            with stream:
                for piece in stream.chunks():
                    if player is not None:
                        player.write(piece.audio)
                    if piece.audio.size:
                        self.chunk.emit(piece.audio)
                    now = time.perf_counter()
                    if now - last >= self.STATS_INTERVAL:
                        last = now
                        self.stats.emit(self._stats(stream))
                result = stream.result()
        except BaseException:
            if player is not None:
                player.stop()
            raise
        if player is not None:
            player.finish()
        if req.out_path is not None:
            from ..audio.export import save_speech
            save_speech(req.out_path, result.audio, result.sample_rate, result.chapters, req.voice_name)
        self.stats.emit(self._stats(stream, done=True))
        return result

    def live_stats(self) -> SynthesisStats | None:
        """The stream's progress now (thread-safe; for a timer on the GUI thread)."""
        stream = self._stream
        return None if stream is None else self._stats(stream)

    def _stats(self, stream, done: bool = False) -> SynthesisStats:
        progress = stream.progress
        player = self._player
        return SynthesisStats("done" if done or progress.done else "speaking", progress,
                              None if player is None else player.waiting)

    def _open_player(self, rate: int):
        from ..audio.playback import StreamPlayer
        from ..engine.sentences import expected_speech_seconds
        try:
            player = StreamPlayer(rate, device=self.request.output_device,
                                  expected_seconds=expected_speech_seconds(self.request.text),
                                  max_chunk_seconds=self.engine.max_chunk_seconds)
        except AudioDeviceError as e:
            self.player_ready.emit(None, str(e))
            return None
        except Exception as e:  # a device library failing in an unexpected way: generate anyway
            log.exception("cannot open the output device")
            self.player_ready.emit(None, f"cannot play audio: {e}")
            return None
        with self._lock:
            self._player = player
        if self.cancel_requested:
            player.stop()
        self.player_ready.emit(player, "")
        return player


class EmbedWorker(Worker):
    """Embeds a reference clip into a Voice (for saving it to the library)."""

    description = "embedding the reference voice"

    def __init__(self, engine, samples: np.ndarray, rate: int, transcript: str | None, name: str):
        super().__init__()
        self.engine, self.samples, self.rate, self.transcript, self.name = engine, samples, rate, transcript, name

    def work(self):
        return self.engine.embed_voice(self.samples, self.rate, ref_text=self.transcript, name=self.name)


class ModelTaskWorker(Worker):
    """Imports a Hugging Face folder (conversion) or downloads and converts a model, into the
    model store, with progress and cancel. `action(store, progress, cancel)` is
    ModelStore.import_hf_folder or ModelStore.download with their arguments bound."""

    def __init__(self, action: Callable[..., Any], description: str):
        super().__init__()
        self._action = action
        self.description = description

    def work(self):
        def progress(fraction: float, text: str) -> None:
            self.progress.emit(float(fraction), str(text))
        return self._action(progress=progress, cancel=self._cancel)
