"""Type stubs of the native module (native/python/bindings.cpp)."""
from typing import Callable

import numpy as np
import numpy.typing as npt

__version__: str
ABI_VERSION: int
ABI_MIN_VERSION: int
MAX_BATCH: int
STATUS_INVALID_PARAMS: int
STATUS_INVALID_MODE: int
STATUS_FAILED: int
STATUS_OUT_OF_MEMORY: int
STATUS_CANCELLED: int
DEFAULT_CODEC_CHUNK_SEC: float

class EngineError(RuntimeError):
    """args = (message, status): status is a negative qt_status code."""

def version() -> str: ...
def abi_version() -> int: ...
def abi_min_version() -> int: ...
def ggml_version() -> str: ...
def voice_ref_min_samples() -> int: ...
def voice_ref_max_samples() -> int: ...
def quantize(data: npt.NDArray[np.float32], type: int) -> npt.NDArray[np.uint8]: ...
def default_max_frames(n_text_ids: int) -> int: ...

class CancelFlag:
    """A cancel request for one synthesize() call, settable from any thread."""
    def __init__(self) -> None: ...
    def set(self) -> None: ...
    def is_set(self) -> bool: ...

class Context:
    def __init__(self, model_path: str, n_threads: int = 0, dump_dir: str | None = None,
                 log_callback: Callable[[int, str], None] | None = None, codec_chunk_sec: float = 0.0) -> None: ...
    def close(self) -> None: ...
    def model_info(self) -> dict[str, int | str]: ...
    def extract_voice_ref(self, pcm: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int32]]: ...
    def synthesize(self, text_ids: npt.NDArray[np.int32], speaker_embedding: npt.NDArray[np.float32],
                   ref_codes: npt.NDArray[np.int32] | None = None, ref_text_ids: npt.NDArray[np.int32] | None = None,
                   language: str = "auto", talker_sampling: dict[str, float] = ..., predictor_sampling: dict[str, float] = ...,
                   seed: int = 0, max_frames: int = 0,
                   on_chunk: Callable[[int, npt.NDArray[np.int32], npt.NDArray[np.float32]], bool | None] | None = None,
                   cancel_flag: CancelFlag | None = None,
                   ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32], bool]:
        """(codes [frames, 16], pcm [frames * samples_per_frame], reached_eos). on_chunk(first_frame,
        codes, pcm) streams the audio as it is decoded (False or an exception cancels; the exception
        is raised here). The GIL is released while computing."""
    def synthesize_batch(self, requests: list[tuple[npt.NDArray[np.int32], int, int]],
                         speaker_embedding: npt.NDArray[np.float32], ref_codes: npt.NDArray[np.int32] | None = None,
                         ref_text_ids: npt.NDArray[np.int32] | None = None, language: str = "auto",
                         talker_sampling: dict[str, float] = ..., predictor_sampling: dict[str, float] = ...,
                         max_batch: int = 4,
                         on_chunk: Callable[[int, int, npt.NDArray[np.int32], npt.NDArray[np.float32], bool],
                                            bool | None]
                         | None = None,
                         cancel_flag: CancelFlag | None = None,
                         ) -> list[tuple[npt.NDArray[np.int32], npt.NDArray[np.float32], bool]]: ...
    def decode(self, codes: npt.NDArray[np.int32], chunk_frames: int = 0) -> npt.NDArray[np.float32]: ...
    def cancel(self) -> None: ...
    def forget_prompts(self) -> None: ...
