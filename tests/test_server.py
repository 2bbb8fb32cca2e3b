"""The speech API (`vocable serve`) driven as its users drive it: the official openai SDK and plain
HTTP against a running server on loopback, on the tiny fixture model."""
from __future__ import annotations

import base64
import io
import json
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import soundfile as sf

from conftest import manifest, reference

openai = pytest.importorskip("openai")

TEXT = "Hello there, this is a test."
GREEDY = {"seed": 7, "greedy": True}
KEY = "k" * 24


@pytest.fixture(scope="module")
def library(tmp_path_factory, engine, reference_clip):
    from vocable import Voice
    from vocable.library.voices import VoiceLibrary

    lib = VoiceLibrary(tmp_path_factory.mktemp("voices"))
    lib.save(Voice(reference("0.6b", "speaker_embedding")), "Ada")
    lib.save(engine.embed_voice(reference_clip, 24000, ref_text=manifest("0.6b")["ref_text"]), "Bea")
    return lib


def start_server(engine, library, **config):
    from vocable.server import ServerConfig, ServerThread
    return ServerThread(lambda: engine, ServerConfig(port=0, **config), library).start()


@pytest.fixture(scope="module")
def server(engine, library):
    thread = start_server(engine, library, max_waiting=3)
    yield thread
    thread.stop()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)


def direct(engine, library, voice="Ada", text=TEXT):
    """The audio of the same request straight from the engine."""
    entry = next(e for e in library.entries() if e.name == voice)
    with engine.synthesize(text, library.load(entry.id), **GREEDY) as stream:
        return stream.result().audio


def decode(data: bytes, fmt: str) -> tuple[np.ndarray, int]:
    if fmt == "aac":
        import av
        with av.open(io.BytesIO(data)) as container:
            frames = [f.to_ndarray().reshape(-1) for f in container.decode(audio=0)]
            return np.concatenate(frames).astype(np.float32), container.streams.audio[0].rate
    audio, rate = sf.read(io.BytesIO(data), dtype="float32")
    return audio, rate


def test_models_list_the_model_and_the_openai_names(client, engine):
    ids = [m.id for m in client.models.list().data]
    assert ids[0] == engine.model_path.stem
    assert {"tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= set(ids)
    assert client.models.retrieve("tts-1").id == "tts-1"
    assert client.models.retrieve(engine.model_path.stem).owned_by == "vocable"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("whisper-1")
    # the dated snapshots that newer clients send
    for model in ("gpt-4o-mini-tts-2025-12-15", "tts-1-hd-1106"):
        assert client.models.retrieve(model).id == model
        assert client.audio.speech.create(model=model, voice="Ada", input=TEXT, response_format="wav",
                                          extra_body=GREEDY).read()[:4] == b"RIFF"


@pytest.mark.parametrize("fmt", ["wav", "pcm", "flac", "mp3", "opus", "aac"])
def test_every_format_decodes_to_the_engines_audio(client, engine, library, fmt):
    with client.audio.speech.with_streaming_response.create(model="tts-1", voice="Ada", input=TEXT,
                                                            response_format=fmt, extra_body=GREEDY) as response:
        assert response.headers["content-type"].startswith({"opus": "audio/ogg", "mp3": "audio/mpeg"}.get(fmt, "audio/"))
        data = response.read()
    expected = direct(engine, library)
    if fmt in ("wav", "pcm", "flac"):   # the engine's samples, as 16-bit PCM
        samples = np.frombuffer(data, "<i2") if fmt == "pcm" else sf.read(io.BytesIO(data), dtype="int16")[0]
        assert np.array_equal(samples, np.round(np.clip(expected, -1, 1) * 32767).astype(np.int16))
        return
    audio, rate = decode(data, fmt)
    # lossy: the same length (give or take the codec's frame and delay) and the same loudness
    seconds = audio.size / rate
    assert abs(seconds - expected.size / 24000) < 0.1, (seconds, expected.size / 24000)
    rms, want = float(np.sqrt(np.mean(audio ** 2))), float(np.sqrt(np.mean(expected ** 2)))
    assert abs(rms - want) < 0.25 * want + 1e-3


def test_the_audio_streams_in_pieces_as_it_is_made(server, engine):
    text = "One sentence. " * 6
    pieces = []
    with httpx.stream("POST", server.url + "/audio/speech", timeout=60,
                      json={"model": "tts-1", "voice": "Ada", "input": text, "response_format": "pcm", **GREEDY}) as r:
        assert r.status_code == 200 and "transfer-encoding" in r.headers
        for piece in r.iter_raw():
            pieces.append((time.perf_counter(), len(piece)))
    assert len(pieces) > 2
    assert pieces[0][0] < pieces[-1][0]


def test_server_sent_events_carry_the_same_audio(server, client):
    raw = client.audio.speech.create(model="tts-1", voice="Ada", input=TEXT, response_format="pcm",
                                     extra_body=GREEDY).read()
    events = []
    with httpx.stream("POST", server.url + "/audio/speech", timeout=60,
                      json={"model": "tts-1", "voice": "Ada", "input": TEXT, "response_format": "pcm",
                            "stream_format": "sse", **GREEDY}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["output_tokens"] > 0
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == raw


def test_speed_changes_the_length_not_the_voice(client):
    def pcm(speed):
        data = client.audio.speech.create(model="tts-1", voice="Ada", input=TEXT, response_format="pcm",
                                          speed=speed, extra_body=GREEDY).read()
        return np.frombuffer(data, "<i2")

    normal, fast, slow = pcm(1.0), pcm(2.0), pcm(0.5)
    assert fast.size == pytest.approx(normal.size / 2, abs=2)
    assert slow.size == pytest.approx(normal.size * 2, abs=2)


def test_in_context_voice_and_voice_by_id(client, library):
    bea = next(e for e in library.entries() if e.name == "Bea")
    with client.audio.speech.with_streaming_response.create(model="tts-1", voice=bea.id, input=TEXT,
                                                            response_format="wav", extra_body=GREEDY) as r:
        assert r.headers["x-vocable-mode"] == "in-context"
        assert r.read()[:4] == b"RIFF"


def test_bad_requests_get_openais_error_json(server, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT)
    assert "unknown voice 'alloy'" in str(e.value) and "Ada" in str(e.value) and "Bea" in str(e.value)
    with pytest.raises(openai.BadRequestError, match="at most 4096"):
        client.audio.speech.create(model="tts-1", voice="Ada", input="x" * 5000)
    with pytest.raises(openai.BadRequestError, match="empty"):
        client.audio.speech.create(model="tts-1", voice="Ada", input="   ")
    with pytest.raises(openai.BadRequestError, match="unknown model"):
        client.audio.speech.create(model="whisper-1", voice="Ada", input=TEXT)
    with pytest.raises(openai.BadRequestError, match="speed"):
        client.audio.speech.create(model="tts-1", voice="Ada", input=TEXT, speed=9)
    r = httpx.post(server.url + "/audio/speech", content=b'{"model": "tts-1", "input": ', timeout=10,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "the request body is not valid JSON"
    r = httpx.post(server.url + "/audio/speech", content=b"{" + b" " * (2 << 20) + b"}", timeout=10,
                   headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = httpx.get(server.url + "/nothing-here", timeout=10)
    assert r.status_code == 404 and "error" in r.json()


def test_a_key_is_checked_and_required_off_loopback(engine, library):
    from vocable.errors import VocableError
    from vocable.server import ServerConfig, check_exposure

    with pytest.raises(VocableError, match="API key"):
        check_exposure(ServerConfig(host="0.0.0.0"))
    with pytest.raises(VocableError, match="at least 16"):
        check_exposure(ServerConfig(host="0.0.0.0", api_key="short"))
    check_exposure(ServerConfig(host="0.0.0.0", api_key=KEY))
    guarded = start_server(engine, library, api_key=KEY)
    try:
        for key in ("wrong-key-wrong-key-wrong", KEY[:-1], ""):
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=guarded.url, api_key=key or "x", max_retries=0).models.list()
        assert httpx.get(guarded.url + "/models", timeout=10).status_code == 401
        assert openai.OpenAI(base_url=guarded.url, api_key=KEY, max_retries=0).models.list().data
    finally:
        guarded.stop()


def test_eight_clients_against_a_full_queue(server, engine):
    """One computes, three wait (max_waiting=3), four are told to come back later; all three in
    line are answered once the engine is free."""
    def ask(_):
        r = httpx.post(server.url + "/audio/speech", timeout=120,
                       json={"model": "tts-1", "voice": "Ada", "input": TEXT, "response_format": "pcm", **GREEDY})
        return r.status_code, r.headers.get("retry-after"), len(r.content)

    gate = server.app.state.gate
    pool = ThreadPoolExecutor(8)
    with engine._lock:   # the engine busy with other work
        first = pool.submit(ask, 0)
        deadline = time.monotonic() + 10
        while not gate.busy and time.monotonic() < deadline:
            time.sleep(0.01)
        rest = [pool.submit(ask, i) for i in range(1, 8)]
        deadline = time.monotonic() + 10
        while sum(f.done() for f in rest) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        refused = [f.result() for f in rest if f.done()]
        assert len(refused) == 4 and gate.waiting == 3
        assert all(status == 429 and int(retry) >= 1 for status, retry, _ in refused)
    answered = [first.result()] + [f.result() for f in rest if f.result()[0] != 429]
    pool.shutdown()
    assert len(answered) == 4 and all(status == 200 and size > 0 for status, _, size in answered)


def test_a_client_that_leaves_cancels_its_synthesis(server, engine, caplog):
    caplog.set_level(logging.INFO, logger="vocable.server")
    with httpx.stream("POST", server.url + "/audio/speech", timeout=60,
                      json={"model": "tts-1", "voice": "Ada", "input": "A long text to speak. " * 60,
                            "response_format": "pcm", "seed": 3}) as r:
        next(r.iter_raw())
    deadline = time.monotonic() + 10
    while server.app.state.gate.busy and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not server.app.state.gate.busy
    seconds = server.app.state.last_cancel_seconds
    assert seconds is not None and seconds < 0.2, seconds   # a frame of audio is 0.08 s
    print(f"disconnect to synthesis end: {1000 * seconds:.1f} ms")
    assert any("speech: disconnected" in m for m in caplog.messages)


LONG_TEXT = "A long text to speak, on and on. " * 100


def unread_stream(server, text: str = LONG_TEXT) -> socket.socket:
    """A speech request from a client that reads the response's first bytes, then nothing more:
    its receive buffer is small, so the server's sends block once the kernel's buffers are full
    (a long text's audio is several MB of pcm)."""
    host, port = server.url.split("//")[1].split("/")[0].split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(60)
    sock.connect((host, int(port)))
    body = json.dumps({"model": "tts-1", "voice": "Ada", "input": text, "response_format": "pcm", "seed": 5}).encode()
    sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert sock.recv(64).startswith(b"HTTP/1.1 200")
    return sock


def read_to_end(sock: socket.socket) -> bytes:
    data = bytearray()
    while piece := sock.recv(1 << 16):
        data += piece
    return bytes(data)


def test_a_slow_reader_does_not_hold_the_engine(engine, library, caplog):
    """The synthesis runs ahead of a client that reads slowly (a player reading at the pace of
    playback): the engine's turn ends with the synthesis, another client is answered meanwhile,
    and the slow one still gets every byte."""
    caplog.set_level(logging.INFO, logger="vocable.server")
    thread = start_server(engine, library)
    try:
        slow = unread_stream(thread)
        gate = thread.app.state.gate
        deadline = time.monotonic() + 90
        while gate.busy and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not gate.busy, "the turn is held while a client reads"
        other = httpx.post(thread.url + "/audio/speech", timeout=60,
                           json={"model": "tts-1", "voice": "Ada", "input": TEXT, "response_format": "pcm", **GREEDY})
        assert other.status_code == 200 and other.content
        time.sleep(0.2)
        # the slow one is still being sent (its sends wait on the client): only the other is over
        assert sum(m.startswith("speech: complete") for m in caplog.messages) == 1
        rest = read_to_end(slow)   # then it reads: the whole response, to its last chunk
        slow.close()
        assert len(rest) > (2 << 20) and rest.endswith(b"0\r\n\r\n")
    finally:
        thread.stop()


def test_a_client_that_stops_reading_is_cut_off(engine, library, caplog):
    caplog.set_level(logging.INFO, logger="vocable.server")
    thread = start_server(engine, library, send_timeout=1.0)
    try:
        stalled = unread_stream(thread)
        deadline = time.monotonic() + 90
        while not any(m.startswith("speech: stalled") for m in caplog.messages) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(m.startswith("speech: stalled, pcm") for m in caplog.messages)
        assert not read_to_end(stalled).endswith(b"0\r\n\r\n")   # the server closed it, short
        stalled.close()
        assert not thread.app.state.gate.busy
    finally:
        thread.stop()


def test_a_client_that_leaves_the_line_is_not_served(server, engine, caplog):
    """A client that gives up while it waits for the engine leaves the line at once (its place
    is free for a live client), and nothing is synthesized for it."""
    caplog.set_level(logging.INFO, logger="vocable.server")
    gate = server.app.state.gate
    request = {"model": "tts-1", "voice": "Ada", "input": TEXT, "response_format": "pcm", **GREEDY}
    pool = ThreadPoolExecutor(1)
    with engine._lock:   # the engine busy with other work
        first = pool.submit(httpx.post, server.url + "/audio/speech", json=request, timeout=60)
        deadline = time.monotonic() + 10
        while not gate.busy and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.url + "/audio/speech", json=request, timeout=httpx.Timeout(10, read=0.5))
        deadline = time.monotonic() + 10
        while gate.waiting and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gate.waiting == 0
    assert first.result().status_code == 200
    pool.shutdown()
    deadline = time.monotonic() + 10   # the line is written once the response is over, after the client has it
    while not any(m.startswith("speech: ") for m in caplog.messages) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)
    assert any("the client left while it waited" in m for m in caplog.messages)
    assert sum(m.startswith("speech: ") for m in caplog.messages) == 1


def test_a_chunked_body_over_the_limit_is_413(server):
    def body(pieces):
        yield b'{"model": "tts-1", "voice": "Ada", "input": "'
        for _ in range(pieces):
            yield b"x" * 65536
        yield b'"}'

    r = httpx.post(server.url + "/audio/speech", content=body(20), timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    # a chunked body within the limit is read as any other
    r = httpx.post(server.url + "/audio/speech", timeout=30, headers={"content-type": "application/json"},
                   content=iter([json.dumps({"model": "tts-1", "voice": "Ada", "input": TEXT, "response_format": "wav",
                                             **GREEDY}).encode()]))
    assert r.status_code == 200 and r.content[:4] == b"RIFF"


def test_a_synthesis_that_fails_at_once_frees_its_encoder(server, client, monkeypatch):
    """A request whose first chunk fails (a device out of memory) gets its error, and the mp3
    encoder's pipe and thread are freed with the synthesis."""
    from vocable.errors import VocableError
    from vocable.server import app as server_app

    closed = []

    class FailingBody(server_app.SpeechBody):
        def start(self):
            raise VocableError("the device ran out of memory")

        def close(self):
            closed.append(self._encoder)
            super().close()

    monkeypatch.setattr(server_app, "SpeechBody", FailingBody)
    encoders = threading.active_count()
    with pytest.raises(openai.BadRequestError, match="ran out of memory"):
        client.audio.speech.create(model="tts-1", voice="Ada", input=TEXT, response_format="mp3")
    assert len(closed) == 1 and not server.app.state.gate.busy
    deadline = time.monotonic() + 5
    while threading.active_count() > encoders and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() <= encoders


def test_the_log_has_the_request_line_never_the_text(client, caplog):
    caplog.set_level(logging.INFO, logger="vocable.server")
    secret = "My bank PIN is four four seven one."
    client.audio.speech.create(model="tts-1", voice="Ada", input=secret, response_format="wav", extra_body=GREEDY).read()
    deadline = time.monotonic() + 10   # the line is written once the response is over, after the client has it
    while not any(m.startswith("POST /v1/audio/speech 200") for m in caplog.messages) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert any(m.startswith("POST /v1/audio/speech 200") for m in caplog.messages)
    assert any(m.startswith("speech: complete, wav, first audio after") for m in caplog.messages)
    assert not any("PIN" in m or secret in m for m in caplog.messages)


def test_upload_a_voice_then_speak_in_it(server, client, reference_clip, tmp_path):
    clip = tmp_path / "me.flac"
    sf.write(clip, reference_clip, 24000)
    r = httpx.post(server.url + "/voices", timeout=60, data={"name": "Cleo", "transcript": manifest("0.6b")["ref_text"]},
                   files={"file": ("me.flac", clip.read_bytes(), "audio/flac")})
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["name"] == "Cleo" and made["in_context"] is True
    listed = httpx.get(server.url + "/voices", timeout=10).json()["data"]
    assert made["id"] in [v["id"] for v in listed]
    assert client.audio.speech.create(model="tts-1", voice="cleo", input=TEXT, response_format="wav",
                                      extra_body=GREEDY).read()[:4] == b"RIFF"
    bad = httpx.post(server.url + "/voices", timeout=10, data={"name": "Bad"},
                     files={"file": ("bad.wav", b"this is not audio at all", "audio/wav")})
    assert bad.status_code == 400 and "error" in bad.json()
    wrong = httpx.post(server.url + "/voices", timeout=10, data={"name": "Doc"},
                       files={"file": ("notes.txt", b"hello", "text/plain")})
    assert wrong.status_code == 400 and ".txt" in wrong.json()["error"]["message"]
    huge = httpx.post(server.url + "/voices", timeout=30, data={"name": "Huge"},
                      files={"file": ("huge.wav", b"\0" * (21 << 20), "audio/wav")})
    assert huge.status_code == 413
    # a second voice of the same name would make the name useless in every later request
    again = httpx.post(server.url + "/voices", timeout=60, data={"name": " cleo "},
                       files={"file": ("me.flac", clip.read_bytes(), "audio/flac")})
    assert again.status_code == 409 and again.json()["error"]["code"] == "voice_exists"
    assert made["id"] in again.json()["error"]["message"]
    assert client.audio.speech.create(model="tts-1", voice="Cleo", input=TEXT, response_format="wav",
                                      extra_body=GREEDY).read()[:4] == b"RIFF"
    named = httpx.post(server.url + "/voices", timeout=10, data={"name": "bad\x07name"},
                       files={"file": ("me.flac", clip.read_bytes(), "audio/flac")})
    assert named.status_code == 400 and named.json()["error"]["param"] == "name"


def test_no_model_yet_is_a_clear_503(library):
    from vocable.server import ServerConfig, ServerThread
    thread = ServerThread(lambda: None, ServerConfig(port=0), library).start()
    try:
        r = httpx.get(thread.url + "/models", timeout=10)
        assert r.status_code == 503 and r.json()["error"]["message"] == "no model is loaded yet"
    finally:
        thread.stop()


def test_load_run_on_loopback(server):
    """A bounded load: 4 clients, 6 requests each. Reports requests per minute and the time to
    the first audio byte (p50, p95) as the clients saw it."""
    firsts: list[float] = []
    lock = threading.Lock()

    def client_run(i):
        for j in range(6):
            started = time.perf_counter()
            with httpx.stream("POST", server.url + "/audio/speech", timeout=120,
                              json={"model": "tts-1", "voice": "Ada", "input": f"Request {i} {j}. {TEXT}",
                                    "response_format": "pcm", "seed": i * 10 + j}) as r:
                assert r.status_code == 200
                chunks = r.iter_raw()
                next(chunks)
                with lock:
                    firsts.append(time.perf_counter() - started)
                for _ in chunks:
                    pass

    started = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(client_run, range(4)))
    wall = time.perf_counter() - started
    p50, p95 = statistics.median(firsts), float(np.percentile(firsts, 95))
    print(f"load run: {len(firsts)} requests in {wall:.1f} s = {60 * len(firsts) / wall:.0f} per minute; "
          f"first audio p50 {1000 * p50:.0f} ms, p95 {1000 * p95:.0f} ms (tiny model, 4 clients)")
    assert len(firsts) == 24


def test_vocable_serve_from_the_command_line(converted, library, cli_env):
    env = dict(cli_env, VOCABLE_API_KEY=KEY)
    proc = subprocess.Popen([sys.executable, "-m", "vocable", "serve", "--model", str(converted("0.6b", "f32")),
                             "--port", "0", "--voices", str(library.root), "--device", "cpu", "--threads", "2"],
                            env=env, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in proc.stderr:
            if "the speech API is at" in line:
                url = line.split("the speech API is at ")[1].split()[0]
                break
        assert url and url.startswith("http://127.0.0.1:")
        sdk = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        assert "Ada" in [v["name"] for v in httpx.get(url + "/voices", headers={"Authorization": f"Bearer {KEY}"},
                                                      timeout=10).json()["data"]]
        assert sdk.audio.speech.create(model="tts-1", voice="Ada", input=TEXT, response_format="wav").read()[:4] == b"RIFF"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    refused = subprocess.run([sys.executable, "-m", "vocable", "serve", "--model", str(converted("0.6b", "f32")),
                              "--host", "0.0.0.0"], env=cli_env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "give an API key" in refused.stderr
