"""Speech recognition: a reference clip's transcript (for in-context cloning without typing),
and a check of a result against its text (word error rate) and its voice (speaker similarity).

faster-whisper runs the Whisper model (`transcriber`), which the model store downloads
(`engine.models.ModelStore.download_whisper`); `check` compares. A layer beside the engine: it
reads audio (`audio.files`) but opens no device, and needs faster-whisper, an optional part
(`pip install 'vocable[asr]'`): without it, it says so."""
from .check import OutputCheck, check_output, speaker_similarity, word_error_rate
from .transcriber import Transcriber, Transcript, find_whisper_model

__all__ = ["OutputCheck", "Transcriber", "Transcript", "check_output", "find_whisper_model", "speaker_similarity",
           "word_error_rate"]
