"""Which audio devices the app may use, found off the GUI thread: the controller's part that
decides whether Play and Record are on, and says why not when they are off."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from ...errors import AudioDeviceError
from .. import workers
from ..workers import FunctionWorker

log = logging.getLogger("vocable.gui")

# Set to 1 to run without audio devices (no recording, no playback), as on a machine without any.
NO_AUDIO_ENV = "VOCABLE_NO_AUDIO"


@dataclass
class AudioAvailability:
    output: bool = False
    input: bool = False
    output_reason: str = ""
    input_reason: str = ""
    outputs: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)


def _device_names(list_devices, what: str) -> tuple[list[str], str]:
    """The names `list_devices()` gives, and in words why there are none ("" when there are)."""
    try:
        names = list_devices()
    except AudioDeviceError as e:
        return [], str(e)
    except Exception as e:  # a broken audio stack must not stop the app
        log.exception("cannot list %s devices", what)
        return [], f"cannot list {what} devices: {e}"
    return names, "" if names else f"no {what} device was found (no sound card, or no sound server running)"


def query_audio_devices() -> AudioAvailability:
    """Which audio devices exist, and in words why there are none (never raises)."""
    a = AudioAvailability()
    if os.environ.get(NO_AUDIO_ENV, "") not in ("", "0"):
        a.output_reason = a.input_reason = f"audio is turned off ({NO_AUDIO_ENV} is set)"
        return a
    from ...audio.playback import output_devices
    from ...audio.recorder import input_devices
    a.outputs, a.output_reason = _device_names(output_devices, "audio output")
    a.inputs, a.input_reason = _device_names(input_devices, "microphone or other audio input")
    a.output, a.input = bool(a.outputs), bool(a.inputs)
    return a


class AudioDevices:
    """The controller's audio devices: `audio` (an AudioAvailability) and the players' device."""

    def refresh_audio(self, wait: bool = False) -> None:
        """Looks for audio devices on a worker (PortAudio's first look can take a moment);
        `audio_changed` tells when the answer is in. `wait`: here and now."""
        if wait:
            self._apply_audio(query_audio_devices())
            return
        workers.start(FunctionWorker(lambda _w: query_audio_devices(), "listing the audio devices"),
                      finished=self._apply_audio,
                      failed=lambda message: self._apply_audio(AudioAvailability(
                          output_reason=message, input_reason=message)))

    def _apply_audio(self, audio: AudioAvailability) -> None:
        self.audio = audio
        self.audio_known = True
        for player in (self.reference_player, self.result_player):
            player.available = self.audio.output
            player.unavailable_reason = self.audio.output_reason
            player.device = self._device(self.settings.output_device)
        if not self.audio.output:
            log.info("playback disabled: %s", self.audio.output_reason)
        if not self.audio.input:
            log.info("recording disabled: %s", self.audio.input_reason)
        self.audio_changed.emit()

    @staticmethod
    def _device(name: str | None):
        return int(name) if name and name.isdigit() else (name or None)
