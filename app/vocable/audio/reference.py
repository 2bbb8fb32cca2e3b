"""Checking a reference clip before cloning: silence trimmed, levels measured, and specific
warnings for what makes a poor clone (no Qt, no engine).

    check = check_reference(samples, rate)      # any rate, [n] or [n, channels]; AudioError if unusable
    check.samples                                # float32 mono at 24 kHz, ready for Engine.embed_voice
    check.warnings                               # sentences to show: too short, too long, clipping, ...

Mixing down, resampling (soxr) and the engine's own limits (at least 1 s, at most the first
60 s) are audio_io.prepare_reference's; this module adds what a person recording a voice needs to
hear about. Levels are measured on 30 ms frames (the usual analysis frame for speech: shorter
than a syllable, longer than a pitch period), as the RMS of each frame in dBFS.

Where the speech is: a frame is speech when it stands out from the clip's own background.
The background (noise floor) is the level of the quietest frames (the 10th percentile: pauses
between words and the lead-in of a recording; ignoring the very quietest 10 % keeps a few
digital zeros or a dropout from setting it). A frame counts as speech when it is
  - 12 dB above that floor (unvoiced consonants such as /s/ and /f/ are 20 to 30 dB under the
    vowels, yet a few dB over room noise; 12 dB is well clear of noise's own frame-to-frame
    spread, about +-3 dB for white noise in 30 ms),
  - and no more than 40 dB under the loudest frame (speech's own range from vowels to the
    softest consonants; anything lower is hum or reverberation tail).
Both are relative, so quiet speech is found as well as loud speech (the "too quiet" warning is
about its level). A clip with no frame above -60 dBFS is refused as silent: a microphone in a
room alone gives -60 to -50 dBFS, so that is a muted input, not a quiet voice.
Trimming keeps from the first speech frame to the last, plus 100 ms on each side (the onset of
a soft consonant and the decay of the last word fall under the threshold but are speech).
A steady signal (hum, constant noise, a test tone) has no frame above its own floor: it is kept
whole and counts as 0 % speech.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .files import ENGINE_RATE, MAX_RATE, MAX_REFERENCE_SECONDS, MIN_RATE, MIN_REFERENCE_SECONDS, prepare_reference
from ..errors import AudioError

FRAME_SECONDS = 0.030
FLOOR_PERCENTILE = 10
ABOVE_FLOOR_DB = 12.0
BELOW_LOUDEST_DB = 40.0
SILENCE_DBFS = -60.0
TRIM_MARGIN_SECONDS = 0.100

# Under 3 s the speaker embedding and the reference codes carry too little of the voice: the
# model's authors ask for 3 s at least, and 3 to 10 s clones best. The engine refuses < 1 s.
GOOD_SECONDS = 3.0
# A full-scale sample is within 0.01 dB of the largest value (int16 32767 reads as 1.0, a
# float device gives 32767/32768 = 0.99997). One such sample is a loud but fine peak; a run of
# 3 or more in a row (at 24 kHz; 0.125 ms, so 6 at 48 kHz) is a flattened wave top, that is
# clipping: a waveform that really peaks there stays above 0.999 that long only below ~100 Hz,
# under any voice's pitch.
FULL_SCALE = 0.999
CLIP_RUN = 3
# Speech recorded at a sensible level peaks between -12 and -3 dBFS. A peak under -30 dBFS is
# 20 dB or more too low: the microphone's own noise and the quantisation of a 16-bit file become
# a large part of the signal, and the clone copies them.
QUIET_PEAK_DBFS = -30.0
# Read speech is about 80 % voice activity, relaxed conversation 50 to 60 %. Under 40 % (after
# trimming) the clip is more pause or noise than voice: the embedding averages them in.
MIN_SPEECH_RATIO = 0.40

DB_FLOOR = -120.0  # level reported for digital silence


@dataclass(frozen=True)
class ReferenceCheck:
    """A reference clip as the engine will get it, and what is wrong with it, if anything."""
    samples: np.ndarray     # float32 mono at 24 kHz, silence trimmed when asked
    sample_rate: int        # 24000
    seconds: float
    trimmed_start: float    # seconds removed at the start
    trimmed_end: float      # seconds removed at the end (not counting what is cut past 60 s)
    peak_db: float          # dBFS of the loudest sample
    rms_db: float           # dBFS of the whole clip's RMS
    speech_ratio: float     # share of 30 ms frames that are speech (see the module doc)
    warnings: list[str]     # problems, as sentences for the user
    notes: list[str] = field(default_factory=list)  # what was done: mixed down, resampled, trimmed
    source_rate: int = ENGINE_RATE
    source_channels: int = 1

    @property
    def ok(self) -> bool:
        return not self.warnings


def _db(x: float) -> float:
    return max(20.0 * float(np.log10(x)), DB_FLOOR) if x > 0 else DB_FLOOR


def frame_levels(mono: np.ndarray, rate: int) -> np.ndarray:
    """RMS level in dBFS of each 30 ms frame (the last one padded with zeros)."""
    n = max(1, int(round(FRAME_SECONDS * rate)))
    frames = -(-mono.size // n)
    padded = np.zeros(frames * n, dtype=np.float64)
    padded[:mono.size] = mono
    power = np.mean(padded.reshape(frames, n) ** 2, axis=1)
    with np.errstate(divide="ignore"):
        return np.maximum(10.0 * np.log10(power), DB_FLOOR)


def speech_threshold(levels: np.ndarray) -> float:
    """Frame level above which a frame is speech (see the module doc)."""
    floor = float(np.percentile(levels, FLOOR_PERCENTILE))
    return max(floor + ABOVE_FLOOR_DB, float(levels.max()) - BELOW_LOUDEST_DB)


def clipped_samples(x: np.ndarray, rate: int = ENGINE_RATE) -> int:
    """Samples (frames, for [n, channels]) inside runs at full scale, in any channel, of at least
    CLIP_RUN samples at 24 kHz (as long in time at other rates)."""
    run = max(CLIP_RUN, int(round(CLIP_RUN * rate / ENGINE_RATE)))
    x2 = x.reshape(x.shape[0], -1)
    clipped = np.zeros(x2.shape[0], dtype=bool)
    for ch in range(x2.shape[1]):
        full = np.abs(x2[:, ch]) >= FULL_SCALE
        if not full.any():
            continue
        edges = np.diff(np.concatenate(([0], full.view(np.int8), [0])))
        starts, ends = np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0]
        for s, e in zip(starts, ends):
            if e - s >= run:
                clipped[s:e] = True
    return int(np.count_nonzero(clipped))


def _as_float(samples: np.ndarray, sample_rate: int) -> np.ndarray:
    """float32 [n] or [n, channels]; what prepare_reference refuses is refused by it, with its message."""
    x = np.asarray(samples)
    numeric = np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)
    rate_ok = isinstance(sample_rate, (int, np.integer)) and MIN_RATE <= int(sample_rate) <= MAX_RATE
    if x.ndim not in (1, 2) or not numeric or x.size == 0 or not rate_ok:
        prepare_reference(x, sample_rate)  # raises AudioError saying which
        raise AudioError("the reference audio cannot be used")  # not reached
    if np.issubdtype(x.dtype, np.integer):
        x = x.astype(np.float32) / float(np.iinfo(x.dtype).max)
    x = x.astype(np.float32, copy=False)
    if not np.all(np.isfinite(x)):
        prepare_reference(x, sample_rate)
        raise AudioError("the reference audio has non-finite samples")  # not reached
    return x


def check_reference(samples: np.ndarray, sample_rate: int, trim: bool = True,
                    source_seconds: float | None = None) -> ReferenceCheck:
    """Trims leading and trailing silence (when `trim`), mixes down to mono, resamples to 24 kHz
    and says what would make a poor clone. `samples`: [n] or [n, channels], float or integer PCM,
    at any rate. AudioError when the clip cannot be used at all: empty, damaged, silent, or
    under 1 s (after trimming). `source_seconds`: the length of the recording when `samples` are
    only its start (audio_io.read_reference); the warnings then give the recording's length, and
    the part not read counts as kept (it is past what a clone uses)."""
    x = _as_float(samples, sample_rate)
    rate = int(sample_rate)
    channels = 1 if x.ndim == 1 else x.shape[1]
    mono = x if x.ndim == 1 else x.mean(axis=1)
    unread_seconds = max(0.0, source_seconds - mono.size / rate) if source_seconds is not None else 0.0

    # where the speech is, on the clip as given (its background is there, before any trimming)
    frame = max(1, int(round(FRAME_SECONDS * rate)))
    levels = frame_levels(mono, rate)
    if levels.max() <= SILENCE_DBFS:
        part = f"of its first {mono.size / rate:.0f} s" if unread_seconds else "of it"
        raise AudioError(f"the reference is silent: no part {part} is louder than {SILENCE_DBFS:.0f} dBFS "
                         "(is the microphone muted or its level at zero?)")
    threshold = speech_threshold(levels)
    active = np.nonzero(levels > threshold)[0]
    start, end = 0, mono.size
    if trim and active.size:
        margin = int(round(TRIM_MARGIN_SECONDS * rate))
        start = max(0, int(active[0]) * frame - margin)
        if not unread_seconds:  # else the recording goes on past what was read: its end is not here
            end = min(mono.size, (int(active[-1]) + 1) * frame + margin)
    trimmed_start, trimmed_end = start / rate, (mono.size - end) / rate
    kept_seconds = (end - start) / rate + unread_seconds
    if kept_seconds < MIN_REFERENCE_SECONDS and (start or end < mono.size):
        raise AudioError(f"after trimming the silence only {kept_seconds:.2f} s of the reference are left; at least "
                         f"{MIN_REFERENCE_SECONDS:.0f} s of speech is needed (3 to 10 s works best)")
    kept = x[start:end]

    clip = prepare_reference(kept, rate)  # mono, 24 kHz, >= 1 s (else AudioError), first 60 s
    out = clip.samples
    notes = [w for w in clip.warnings if not w.startswith("the reference is ")]  # its 60 s note: ours below
    if rate != ENGINE_RATE:
        notes.append(f"resampled from {rate} Hz to {ENGINE_RATE} Hz")
    if trimmed_start >= 0.005 or trimmed_end >= 0.005:
        notes.append(f"trimmed {trimmed_start:.2f} s of silence at the start and {trimmed_end:.2f} s at the end")

    used = kept[:int(MAX_REFERENCE_SECONDS * rate)]
    n_clipped = clipped_samples(used, rate)
    peak_db = _db(float(np.max(np.abs(out))))
    rms_db = _db(float(np.sqrt(np.mean(out.astype(np.float64) ** 2))))
    speech_ratio = float(np.mean(frame_levels(out, ENGINE_RATE) > threshold))

    warnings = []
    after = " after trimming the silence" if trimmed_start or trimmed_end else ""
    if kept_seconds < GOOD_SECONDS:
        warnings.append(f"too short for a good clone: the reference is {kept_seconds:.1f} s long{after}; "
                        f"{GOOD_SECONDS:.0f} to 10 s of speech clones much better")
    if kept_seconds > MAX_REFERENCE_SECONDS:
        warnings.append(f"too long: the reference is {kept_seconds:.1f} s long{after}; only its first "
                        f"{MAX_REFERENCE_SECONDS:.0f} s are used (10 to 20 s is plenty)")
    if n_clipped:
        warnings.append(f"clipping: {n_clipped} samples ({1000 * n_clipped / rate:.0f} ms) are at full scale, so the "
                        "voice is distorted and the clone copies it; record again with the input level lower")
    if peak_db < QUIET_PEAK_DBFS:
        warnings.append(f"too quiet: the loudest sample is at {peak_db:.0f} dBFS (below {QUIET_PEAK_DBFS:.0f} dBFS); "
                        "raise the input level or speak closer to the microphone")
    if speech_ratio < MIN_SPEECH_RATIO:
        todo = "trim the silence, or record again speaking throughout" if not trim else \
            "record again in a quiet room, speaking throughout"
        warnings.append(f"mostly silence: only {speech_ratio:.0%} of the reference is speech (the rest is silence "
                        f"or steady noise; {MIN_SPEECH_RATIO:.0%} at least makes a good clone); {todo}")
    return ReferenceCheck(samples=out, sample_rate=ENGINE_RATE, seconds=out.size / ENGINE_RATE,
                          trimmed_start=trimmed_start, trimmed_end=trimmed_end, peak_db=peak_db, rms_db=rms_db,
                          speech_ratio=speech_ratio, warnings=warnings, notes=notes, source_rate=rate,
                          source_channels=channels)
