"""PortAudio devices for playback and recording: the sounddevice module, device names, and the
device to open, each failing with an AudioDeviceError that says what is missing."""
from __future__ import annotations

from ..errors import AudioDeviceError

# kind -> (channel count field, what the user was doing, what is missing, why it may be missing)
_KINDS = {
    "output": ("max_output_channels", "play audio", "audio output device",
               "no sound card, or no sound server such as PipeWire or PulseAudio running"),
    "input": ("max_input_channels", "record audio", "microphone or other audio input device",
              "no sound card with an input, or no sound server such as PipeWire or PulseAudio running"),
}


def sounddevice_module(action: str):
    """The sounddevice module, or AudioDeviceError saying what is missing ("cannot <action>: ...")."""
    try:
        import sounddevice
    except ImportError as e:
        raise AudioDeviceError(f"cannot {action}: the Python package 'sounddevice' is not installed "
                               "(pip install sounddevice)") from e
    except OSError as e:  # sounddevice raises OSError when it cannot load the PortAudio library
        raise AudioDeviceError(f"cannot {action}: the PortAudio library is not installed "
                               "(on Debian or Ubuntu: apt install libportaudio2)") from e
    return sounddevice


def device_names(sd, kind: str) -> list[str]:
    """Names of the devices of `kind` ("output" or "input") PortAudio sees."""
    channels = _KINDS[kind][0]
    try:
        return [d["name"] for d in sd.query_devices() if d[channels] > 0]
    except sd.PortAudioError as e:
        raise AudioDeviceError(f"cannot list audio devices: {e}") from e


def find_device(sd, device: int | str | None, kind: str) -> dict:
    """query_devices() entry of the device of `kind` to open: `device` by index, by its name, or
    by a part of its name; None: the default one, else the first one there is."""
    channels, action, what, why = _KINDS[kind]
    try:
        devices = list(sd.query_devices())
    except sd.PortAudioError as e:
        raise AudioDeviceError(f"cannot {action}: PortAudio cannot list the devices ({e})") from e
    usable = [d for d in devices if d[channels] > 0]
    if not usable:
        raise AudioDeviceError(f"cannot {action}: no {what} was found ({why})")
    if device is None:
        try:
            info = sd.query_devices(kind=kind)
            if info[channels] > 0:
                return info
        except (sd.PortAudioError, ValueError):
            pass
        return usable[0]
    if isinstance(device, int) and not isinstance(device, bool):
        match = [d for d in usable if d["index"] == device]
    else:  # the device of that name, else one whose name has it ("default" is not "sysdefault")
        wanted = str(device).lower()
        match = ([d for d in usable if d["name"].lower() == wanted]
                 or [d for d in usable if wanted in d["name"].lower()])
    if not match:
        names = ", ".join(f"{d['index']}: {d['name']}" for d in usable)
        raise AudioDeviceError(f"cannot {action}: no {kind} device matches {device!r} (there are: {names})")
    return match[0]
