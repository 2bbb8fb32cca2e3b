"""The audio layer: sound files, devices, playback, recording, and the checks of a reference clip.

`files` reads and writes audio files and resamples (no device); `devices`, `playback` and
`recorder` are the only modules that open a sound device (through sounddevice, which may be
missing: they say so instead of failing to import); `reference` judges whether a clip makes a
usable voice.
"""
