"""The model in use and the settings: load a converted model on a worker, import a Hugging Face
folder or download one (with progress and cancel), and keep the settings saved."""
from __future__ import annotations

import logging
from pathlib import Path

from ...about import model_license
from ...engine.models import DEFAULT_REPO
from ...errors import ModelError
from .. import workers
from ..workers import FunctionWorker, LoadModelWorker, ModelTaskWorker

log = logging.getLogger("vocable.gui")


class ModelActions:
    """The controller's model (`engine`, `model_path`, `languages`) and `settings`."""

    def _model_entries(self):
        try:
            return self.models.entries()
        except Exception as e:
            log.warning("cannot list the models: %s", e)
            return []

    def model_entries(self):
        return self._model_entries()

    @staticmethod
    def compute_devices() -> list[dict]:
        """Where the model can run, the CPU first: dicts of id, description, kind and memory
        (bytes); [] with the reason logged when the engine cannot list them."""
        try:
            from ...engine import devices
            return devices()
        except Exception:
            log.exception("cannot list the compute devices")
            return []

    def load_model(self, path: Path) -> None:
        """Loads a converted model (a .gguf anywhere, or one in the model store) on a worker."""
        path = Path(path)
        if self.is_generating:
            self.error.emit("Busy", "stop the generation before changing the model")
            return
        self._set_model_state("loading", f"loading {path.name}...")
        worker = LoadModelWorker(path, self.settings.threads, self.settings.compute_device)
        self._model_worker = worker
        workers.start(worker, finished=lambda result: self._model_loaded(worker, path, *result),
                      failed=lambda message: self._model_failed(worker, path, message))

    def _model_loaded(self, worker, path: Path, engine, languages) -> None:
        if worker is not self._model_worker:   # a later load replaced this one while it ran
            engine.close()
            return
        old, self.engine = self.engine, engine
        if old is not None:
            old.close()
        self.model_path = path
        self.model_description = self._describe_model(path, engine)
        self.languages = list(languages)
        self.settings.model_path = str(path)
        self._save_settings()
        if self.reference is not None and self.reference.library_id is None:
            self.reference.voice = None  # embeddings belong to a model
            self._embed_in_background(self.reference)
        self._set_model_state("ready", self.model_description)
        self.languages_changed.emit(self.languages)
        self._update_mode()
        self.status.emit(f"model ready: {self.model_description}")
        if engine.device_fallback and self.settings.compute_device != "auto":
            # "auto" without a GPU is the usual case, not news; a device asked for by name is
            self.error.emit("Running on the CPU", f"{self.settings.compute_device} is not in use: "
                                                  f"{engine.device_fallback}")

    @staticmethod
    def _describe_model(path: Path, engine) -> str:
        where = "" if engine.device == "cpu" else f", on {engine.device}"
        return f"{path.name} ({engine.info.get('variant') or '?'}{where})"

    def _check_the_device_kept(self) -> None:
        """A device that ran out of memory during a request was given up for the CPU (the request
        ran again there): the model's description and the user learn it once."""
        engine = self.engine
        if engine is None or self.model_path is None:
            return
        description = self._describe_model(self.model_path, engine)
        if description == self.model_description:
            return
        self.model_description = description
        self._set_model_state("ready", description)
        self.error.emit("Running on the CPU", f"the device was given up: {engine.device_fallback}")

    def _model_failed(self, worker, path: Path, message: str) -> None:
        if worker is not self._model_worker:
            return
        self._set_model_state("error" if self.engine is None else "ready",
                              self.model_description if self.engine is not None else message)
        self.error.emit("Cannot load the model", message)

    def _set_model_state(self, state: str, text: str) -> None:
        self.model_status = state
        self.model_state.emit(state, text)

    @property
    def has_model(self) -> bool:
        return self.engine is not None

    def model_license(self) -> tuple[str, str] | None:
        """(the model in use, what is known of its license) for the about dialog; None without one."""
        if self.model_path is None:
            return None
        try:
            entry = self.models.describe(self.model_path)
        except ModelError as e:
            return self.model_path.name, f"unknown ({e})"
        return entry.name, model_license(entry.license)

    def import_hf_folder(self, folder: Path, weight_type: str | None = None) -> None:
        weight_type = weight_type or self.settings.quantization
        self._run_model_task(lambda progress, cancel: self.models.import_hf_folder(
            Path(folder), weight_type, progress=progress, cancel=cancel), f"converting {Path(folder).name}")

    def download_model(self, repo_id: str = DEFAULT_REPO, weight_type: str | None = None) -> None:
        weight_type = weight_type or self.settings.quantization
        self._run_model_task(lambda progress, cancel: self.models.download(
            repo_id, weight_type, progress=progress, cancel=cancel), f"downloading {repo_id}")

    def add_converted_model(self, path: Path) -> None:
        """A converted .gguf picked by the user: checked, then used where it is."""
        def check(_worker):
            return self.models.describe(Path(path))
        workers.start(FunctionWorker(check, "reading the model"), finished=lambda entry: self.load_model(entry.path),
                      failed=lambda message: self.error.emit("Not a Vocable model", message))

    def _run_model_task(self, action, description: str, finished=None) -> None:
        """`action(progress, cancel)` on a worker; `finished(its result)` on success (default: load
        the model it made)."""
        if self._model_task is not None:
            self.error.emit("Busy", "a model is already being imported or downloaded")
            return
        worker = ModelTaskWorker(action, description)
        self._model_task = worker
        self.model_task.emit("running", -1.0, description + "...")
        workers.start(worker, finished=lambda result: self._model_task_finished(result, finished),
                      failed=lambda message: self._model_task_ended("failed", message),
                      cancelled=lambda: self._model_task_ended("cancelled", "cancelled; nothing was kept"),
                      progress=lambda fraction, text: self.model_task.emit("running", fraction, text))

    def _model_task_finished(self, result, finished=None) -> None:
        self._model_task = None
        self.model_task.emit("finished", 1.0, f"{result.name} is ready")
        if finished is not None:
            finished(result)
        else:
            self.load_model(result.path)

    def _model_task_ended(self, state: str, message: str) -> None:
        self._model_task = None
        self.model_task.emit(state, 0.0, message)
        if state == "failed":
            self.status.emit(message)

    def cancel_model_task(self) -> None:
        if self._model_task is not None:
            self._model_task.cancel()

    @property
    def model_task_running(self) -> bool:
        return self._model_task is not None

    def update_settings(self, **changes) -> None:
        model_before = self.settings.model_path
        threads_before = self.settings.threads
        device_before = self.settings.compute_device
        for key, value in changes.items():
            setattr(self.settings, key, value)
        self._save_settings()
        self.refresh_audio()
        self.apply_api_setting()
        self.settings_changed.emit()
        if (self.settings.model_path and self.settings.model_path != model_before) or \
                (self.model_path is not None and (self.settings.threads != threads_before or
                                                  self.settings.compute_device != device_before)):
            if self.is_generating:   # applied once the generation ends, not refused
                self._reload_after_generation = True
                self.status.emit("the model reloads with the new settings once the generation ends")
            else:
                self.load_model(Path(self.settings.model_path))

    def _apply_deferred_reload(self) -> None:
        if self._reload_after_generation and self.settings.model_path:
            self._reload_after_generation = False
            self.load_model(Path(self.settings.model_path))

    def _save_settings(self) -> None:
        if not self.persist_settings:
            return
        try:
            self.settings.save()
        except Exception as e:
            log.exception("cannot save the settings")
            self.status.emit(f"cannot save the settings: {e}")
