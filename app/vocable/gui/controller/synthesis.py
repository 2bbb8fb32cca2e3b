"""Generate and what it leaves: the synthesis worker streaming into the result player, its live
figures, the result added to the history, and the result saved to a file."""
from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import Slot

from ...engine import runaway
from ...errors import VocableError
from .. import workers
from ..workers import FunctionWorker, SynthesisRequest, SynthesisWorker
from .reference import Reference

log = logging.getLogger("vocable.gui")


def _several(chapters) -> tuple:
    """The chapters with audio, where there are at least two: what can be saved as chapters."""
    from ...audio.export import spoken_chapters
    spoken = spoken_chapters(chapters)
    return spoken if len(spoken) > 1 else ()


def export_formats() -> tuple[str, ...]:
    """The extensions the result can be saved as here: M4B only where PyAV is installed."""
    from ...audio.export import output_suffixes
    return tuple(suffix.lstrip(".") for suffix in output_suffixes())


EXPORT_FORMATS = export_formats()


class SynthesisActions:
    """The controller's generation: the running worker, `result` and the result player."""

    @property
    def is_generating(self) -> bool:
        return self._synthesis is not None

    def can_generate(self) -> tuple[bool, str]:
        if self.engine is None:
            return False, "no model is loaded"
        if self.model_status == "loading":   # the engine in hand is about to be closed
            return False, "the model is loading"
        if self.reference is None:
            return False, "choose a reference voice first"
        if self.is_generating:
            return False, "already generating"
        return True, ""

    def generate(self, text: str, language: str = "auto", temperature: float = 0.9, top_k: int = 50,
                 seed: int | None = None, greedy: bool = False, max_frames: int | None = None,
                 to_file: Path | None = None) -> bool:
        """Starts speaking `text` (embedding the reference first if needed); False, with the
        reason in `error`, when it cannot start. `to_file`: speak into that audio file instead of
        playing it, a long text FILE_BATCH segments at a time (faster in all; the audio shows as
        each segment completes)."""
        ok, why = self.can_generate()
        if not ok:
            self.error.emit("Cannot generate", why[0].upper() + why[1:] + ".")
            return False
        if not text.strip():
            self.error.emit("Cannot generate", "The text is empty: type something to say.")
            return False
        from ...engine import FILE_BATCH
        if to_file is not None:
            from ...audio.export import check_output
            try:
                check_output(Path(to_file))
            except VocableError as e:
                self.error.emit("Cannot speak into that file", str(e))
                return False
        ref = self.reference
        transcript = self.transcript.strip() or None
        mode, _ = self.clone_mode()
        settings = dict(language=language, temperature=temperature, top_k=top_k, seed=seed, greedy=greedy,
                        mode=mode, model=self.model_path.name if self.model_path else "")
        request = SynthesisRequest(text=text, language=language, transcript=transcript, temperature=temperature,
                                   top_k=top_k, seed=seed, greedy=greedy, voice=ref.voice,
                                   pending_voice=ref.pending_voice if ref.voice is None else None,
                                   reference=ref.samples, reference_rate=ref.sample_rate, voice_name=ref.name,
                                   play=self.audio.output and to_file is None,
                                   output_device=self._device(self.settings.output_device),
                                   max_frames=max_frames, settings=settings,
                                   out_path=Path(to_file) if to_file is not None else None,
                                   batch=FILE_BATCH if to_file is not None else 1)
        if language != self.settings.language:
            self.settings.language = language
            self._save_settings()
        self.reference_player.stop()
        self.result = None
        self.result_text = text
        self.result_history_id = None
        self.result_chapters = ()
        self.result_player.begin_stream(self.engine.sample_rate)
        self.result_ready.emit(None)
        worker = SynthesisWorker(self.engine, request)
        # the worker's own signals go to slots of objects on this thread (queued to it)
        worker.voice_ready.connect(self._on_voice_ready)
        worker.player_ready.connect(self._player_ready)
        worker.chunk.connect(self.result_player.append)
        worker.stats.connect(self._on_stats)
        self._synthesis = worker
        self._synthesis_reference = ref
        self.generating.emit(True)
        self.progress_text.emit("starting...")
        self._stats_timer.start()
        workers.start(worker, finished=lambda result: self._synthesis_finished(worker, result),
                      failed=lambda message: self._synthesis_ended(worker, "failed", message),
                      cancelled=lambda: self._synthesis_ended(worker, "cancelled", ""))
        log.info("generate: %d characters, %s, %s", len(text), mode, settings)
        return True

    def stop(self) -> None:
        """Stops the generation and its playback at once; after it, the playback of the result."""
        worker = self._synthesis
        if worker is not None:
            worker.cancel()
        self.result_player.stop()

    def _voice_embedded(self, ref: Reference, voice) -> None:
        if self.reference is ref:
            ref.voice = voice

    @Slot(object)
    def _on_voice_ready(self, voice) -> None:
        if self._synthesis_reference is not None:
            self._voice_embedded(self._synthesis_reference, voice)

    @Slot(object)
    def _on_stats(self, stats) -> None:
        if self._synthesis is not None:
            self.progress_text.emit(stats.describe())

    @Slot(object, str)
    def _player_ready(self, player, reason: str) -> None:
        if player is None:
            if reason:
                self.status.emit(f"playing is off: {reason}; the audio is still generated")
            return
        if self._synthesis is not None:
            self.result_player.attach_stream_player(player)
        else:
            player.stop()

    def _stats_tick(self) -> None:
        worker = self._synthesis
        if worker is not None:
            stats = worker.live_stats()
            if stats is not None:
                self.progress_text.emit(stats.describe())

    def _synthesis_finished(self, worker: SynthesisWorker, result) -> None:
        self._stats_timer.stop()
        self._synthesis = None
        self._check_the_device_kept()
        self.result = result
        self.result_chapters = _several(result.chapters)
        self.result_player.end_stream(result.audio)
        summary = (f"{result.seconds:.1f} s of audio in {result.wall_time:.1f} s: first audio after "
                   f"{result.time_to_first_audio:.2f} s, real-time factor {result.real_time_factor:.2f}; "
                   f"{result.mode}, seed {result.seed}"
                   + ("" if result.reached_eos or result.runaway else "; stopped at the length cap")
                   + (f"; {runaway.summary(result.runaway)}" if result.runaway else ""))
        self.progress_text.emit(summary)
        settings = dict(worker.request.settings, seed=result.seed, mode=result.mode, mode_reason=result.mode_reason)
        voice_name = worker.request.voice_name
        try:
            entry = self.history.add(worker.request.text, voice_name, settings, result.audio, result.sample_rate,
                                     result.chapters)
            self.result_history_id = entry.id
            self.history_changed.emit()
        except Exception as e:
            log.exception("cannot add to the history")
            self.error.emit("Cannot save to the history", str(e))
        self.generating.emit(False)
        self._apply_deferred_reload()
        self.result_ready.emit(result)
        if self.settings.check_results:
            reference = self._synthesis_reference
            self.check_result(result, worker.request.text,
                              worker.request.voice or (reference.voice if reference is not None else None))
        out = worker.request.out_path
        if out is not None:
            self.settings.export_dir = str(out.parent)
            self._save_settings()
        self.status.emit(("done: " if out is None else f"saved {out}: ") + summary)

    def _synthesis_ended(self, worker: SynthesisWorker, how: str, message: str) -> None:
        self._stats_timer.stop()
        if self._synthesis is worker:
            self._synthesis = None
        self._check_the_device_kept()
        self.result_player.stop()
        self.result_player.end_stream()
        self.generating.emit(False)
        self._apply_deferred_reload()
        if how == "cancelled":
            text = f"stopped after {self.result_player.seconds:.1f} s of audio"
            self.progress_text.emit(text)
            self.status.emit(text)
        else:
            self.progress_text.emit("failed: " + message)
            self.error.emit("Generation failed", message)

    @property
    def is_saving(self) -> bool:
        return self._saving is not None

    def save_result(self, path: Path) -> bool:
        """Writes the shown result by the extension (EXPORT_FORMATS), an M4B with its chapters,
        on a worker (an hour as MP3 takes tens of seconds): `saved` with the file, or `error`.
        False, with the reason in `error`, when it cannot start."""
        from ...audio.export import save_speech
        samples, rate = self._result_audio()
        if samples is None:
            return False
        path, chapters, narrator = Path(path), self.result_chapters, self._result_voice_name()
        return self._save_on_worker("saving the audio", "Cannot save the audio", path.parent,
                                    lambda: [Path(save_speech(path, samples, rate, chapters, narrator))],
                                    lambda files: f"saved {files[0]}")

    def save_chapters(self, path: Path) -> bool:
        """Writes each chapter of the shown result to its own file, in the format of `path`'s
        extension, into the folder `path` names without it (book.mp3: book/01 Title.mp3, ...),
        on a worker as save_result."""
        from ...audio.export import write_chapter_files
        samples, rate = self._result_audio()
        if samples is None:
            return False
        if len(self.result_chapters) < 2:
            self.error.emit("No chapters", "The text had no headings: start each chapter with a line like "
                            "“# Chapter One”.")
            return False
        path, chapters = Path(path), self.result_chapters
        return self._save_on_worker("saving the chapters", "Cannot save the chapters", path.parent,
                                    lambda: write_chapter_files(path.with_suffix(""), samples, rate, chapters,
                                                                path.suffix),
                                    lambda files: f"saved {len(files)} chapters in {files[0].parent}")

    def _save_on_worker(self, what: str, failure: str, folder: Path, write, done_text) -> bool:
        """`write()` (the files it wrote) off the GUI thread, one save at a time; then the export
        folder is remembered, `status` says `done_text(files)` and `saved` has the files."""
        if self._saving is not None:
            self.error.emit(failure, "the last save is still being written; try again when it is done")
            return False
        worker = FunctionWorker(lambda _worker: write(), what)
        self._saving = worker

        def finished(files) -> None:
            self._saving = None
            self.saving.emit(False)
            self._saved_into(folder, done_text(files))
            self.saved.emit(files)

        def failed(message: str) -> None:
            self._saving = None
            self.saving.emit(False)
            self.error.emit(failure, message)

        self.saving.emit(True)
        workers.start(worker, finished=finished, failed=failed)
        return True

    def _result_audio(self):
        samples, rate = self.result_player.samples, self.result_player.sample_rate
        if samples.size == 0 or self.result_player.streaming:
            self.error.emit("Nothing to save", "Generate something first.")
            return None, rate
        return samples, rate

    def _result_voice_name(self) -> str:
        if self.result_history_id is not None:
            try:
                return self.history.entry(self.result_history_id).voice_name
            except VocableError:   # deleted meanwhile: the file is saved without a narrator
                return ""
        return self._synthesis_reference.name if self._synthesis_reference is not None else ""

    def _saved_into(self, folder: Path, message: str) -> None:
        self.settings.export_dir = str(folder)
        self._save_settings()
        self.status.emit(message)

    def default_export_dir(self) -> Path:
        d = self.settings.export_dir
        return Path(d) if d and Path(d).is_dir() else Path.home()
