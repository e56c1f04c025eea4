"""Real audio files for memo tests, encoded by FFmpeg (PyAV), not written by hand here."""

from __future__ import annotations

import io
import wave

import numpy as np


def encoded_audio(container: str, seconds: float, codec: str = "libopus", rate: int = 48000) -> bytes:
    """A 440 Hz tone of ``seconds`` in ``container`` ("webm", "ogg") encoded with ``codec``."""
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.layout = "mono"
        n = int(seconds * rate)
        pcm = (0.3 * np.sin(2 * np.pi * 440 * np.arange(n) / rate)).astype(np.float32)
        for i in range(0, n, 960):
            frame = av.AudioFrame.from_ndarray(pcm[None, i:i + 960], format="flt", layout="mono")
            frame.sample_rate = rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def wav_audio(seconds: float, rate: int = 16000) -> bytes:
    """Silence as 16-bit mono PCM WAV (the standard library's writer)."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(2 * int(seconds * rate)))
    return buf.getvalue()


def tagged_webm(seconds: float, tags: dict[str, str]) -> bytes:
    """A WebM memo as a recorder might leave it: the tone of ``encoded_audio`` remuxed with
    ``tags`` in the container's and the stream's metadata (FFmpeg also writes its muxing and
    writing application)."""
    import av

    source = encoded_audio("webm", seconds)
    buf = io.BytesIO()
    with av.open(io.BytesIO(source)) as inp, av.open(buf, mode="w", format="webm") as out:
        out.metadata.update(tags)
        audio = inp.streams.audio[0]
        stream = out.add_stream_from_template(audio)
        stream.metadata.update(tags)
        for packet in inp.demux(audio):
            if packet.dts is None:
                continue
            packet.stream = stream
            out.mux(packet)
    return buf.getvalue()
