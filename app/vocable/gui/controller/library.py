"""The saved voices and the history of generations, as the sidebar shows them: save, use, rename,
export, import and delete voices; replay, export and delete past generations."""
from __future__ import annotations

import copy
import logging
from pathlib import Path

from ...errors import VocableError
from .. import workers
from ..workers import EmbedWorker, FunctionWorker
from .reference import Reference
from .synthesis import _several

log = logging.getLogger("vocable.gui")


class LibraryActions:
    """The controller's stores: `library` (voices) and `history`."""

    def _listed(self, entries, what: str) -> list:
        """A store's entries for a panel; an unreadable store is reported and lists nothing."""
        try:
            return entries()
        except Exception as e:
            log.exception("cannot list %s", what)
            self.error.emit(f"Cannot read {what}", str(e))
            return []

    def voice_entries(self):
        return self._listed(self.library.entries, "the voice library")

    def save_voice(self, name: str) -> None:
        """Saves the current reference's voice (embedding it first if needed) under `name`."""
        name = name.strip()
        ref = self.reference
        if not name:
            self.error.emit("Cannot save the voice", "Give the voice a name.")
            return
        if ref is None:
            self.error.emit("Cannot save the voice", "Choose a reference voice first.")
            return
        transcript = self.transcript.strip() or None
        if ref.voice is not None:
            self._store_voice(ref, ref.voice, name, transcript)
            return
        if self.engine is None:
            self.error.emit("Cannot save the voice", "A model is needed to make the voice: load one first.")
            return
        if self.is_generating:
            self.error.emit("Busy", "Wait for the generation to end (or stop it), then save the voice.")
            return
        def embedded(voice) -> None:
            self._voice_embedded(ref, voice)
            self._store_voice(ref, voice, name, transcript)

        self.status.emit("embedding the reference voice...")
        workers.start(EmbedWorker(self.engine, ref.samples, ref.sample_rate, transcript, name), finished=embedded,
                      failed=lambda message: self.error.emit("Cannot make the voice", message))

    def _store_voice(self, ref: Reference, voice, name: str, transcript: str | None) -> None:
        voice = copy.copy(voice)
        voice.name = name
        if transcript is not None or ref.library_id is None:
            voice.ref_text = transcript
        try:
            entry = self.library.save(voice, name)
        except VocableError as e:
            self.error.emit("Cannot save the voice", str(e))
            return
        except Exception as e:
            log.exception("saving a voice")
            self.error.emit("Cannot save the voice", str(e))
            return
        self.library_changed.emit()
        self.status.emit(f"saved the voice '{entry.name}'")

    def use_voice(self, voice_id: str) -> None:
        """A saved voice becomes the reference (no audio: the embedding and codes are kept)."""
        try:
            voice = self.library.load(voice_id)
        except VocableError as e:
            self.error.emit("Cannot load the voice", str(e))
            return
        name = voice.name or voice_id
        if self.engine is not None and voice.model_variant and voice.model_variant != self.engine.info.get("variant"):
            self.status.emit(f"'{name}' was made with the {voice.model_variant} model; it may not fit this one")
        self.reference = Reference(name, None, 24000, None, None, voice, voice_id)
        self.reference_player.clear()
        self.transcript = voice.ref_text or ""
        self.reference_changed.emit()
        self._update_mode()
        self.status.emit(f"voice: {name}")

    def rename_voice(self, voice_id: str, name: str) -> None:
        self._library_op(lambda: self.library.rename(voice_id, name.strip()), "Cannot rename the voice")

    def delete_voice(self, voice_id: str) -> None:
        self._library_op(lambda: self.library.delete(voice_id), "Cannot delete the voice")

    def export_voice(self, voice_id: str, dest: Path) -> None:
        if self._library_op(lambda: self.library.export(voice_id, Path(dest)), "Cannot export the voice", False):
            self.status.emit(f"exported the voice to {dest}")

    def import_voice(self, src: Path) -> None:
        if self._library_op(lambda: self.library.import_file(Path(src)), "Cannot import the voice"):
            self.status.emit(f"imported {Path(src).name}")

    def add_clip_to_voice(self, voice_id: str, path: Path) -> None:
        """Averages another recording of the speaker into a saved voice (on a worker); the clip
        in-context cloning continues stays the voice's first."""
        engine = self.engine
        if engine is None:
            self.error.emit("Cannot add the clip", "A model is needed to embed the clip: load one first.")
            return

        root = self.library.root

        def work(_worker):
            from ...audio.files import read_reference
            from ...audio.reference import check_reference
            from ...library.voices import VoiceLibrary
            library = VoiceLibrary(root)  # its own: the GUI thread's is not shared
            samples, rate, seconds = read_reference(path)
            check = check_reference(samples, rate, trim=True, source_seconds=seconds)
            voice = engine.add_clip(library.load(voice_id), check.samples, check.sample_rate)
            return library.replace(voice_id, voice)

        def done(entry) -> None:
            if self.reference is not None and self.reference.library_id == voice_id:
                self.reference.voice = self.library.load(voice_id)   # the next Generate uses the new one
            self.library_changed.emit()
            self.status.emit(f"'{entry.name}' now averages {entry.clips} clips")

        workers.start(FunctionWorker(work, "adding a clip to the voice"), finished=done,
                      failed=lambda message: self.error.emit("Cannot add the clip", message))

    def _library_op(self, op, title: str, changes: bool = True) -> bool:
        try:
            op()
        except VocableError as e:
            self.error.emit(title, str(e))
            return False
        except Exception as e:
            log.exception(title)
            self.error.emit(title, f"{type(e).__name__}: {e}")
            return False
        if changes:
            self.library_changed.emit()
        return True

    # -- history --------------------------------------------------------------------------------------------

    def history_entries(self):
        return self._listed(self.history.entries, "the history")

    def show_history(self, entry_id: str, play: bool = True) -> None:
        """Shows a past generation in the result view (and plays it)."""
        if self.is_generating:
            self.error.emit("Busy", "Stop the generation first.")
            return
        try:
            samples, rate = self.history.load_audio(entry_id)
        except VocableError as e:
            self.error.emit("Cannot replay", str(e))
            return
        entry = next((e for e in self.history_entries() if e.id == entry_id), None)
        self.result = None
        self.result_history_id = entry_id
        self.result_text = entry.text if entry else ""
        self.result_chapters = _several(entry.chapters) if entry else ()
        self.result_player.set_clip(samples, rate)
        self.result_ready.emit(None)
        if entry is not None:
            created = entry.created.astimezone()
            self.progress_text.emit(f"from the history: {entry.voice_name}, {created:%Y-%m-%d %H:%M}, "
                                    f"{entry.seconds:.1f} s")
        if play and self.audio.output:
            self.result_player.play()

    def export_history(self, entry_id: str, dest: Path) -> bool:
        """Writes a generation of the history to `dest` (its format by the extension) on a
        worker, as save_result."""
        dest = Path(dest)
        return self._save_on_worker("exporting from the history", "Cannot export", dest.parent,
                                    lambda: [Path(self.history.export(entry_id, dest))],
                                    lambda files: f"exported {files[0]}")

    def delete_history(self, entry_id: str) -> None:
        try:
            self.history.delete(entry_id)
        except VocableError as e:
            self.error.emit("Cannot delete", str(e))
            return
        if self.result_history_id == entry_id and not self.is_generating:
            self.result_history_id = None
        self.history_changed.emit()
