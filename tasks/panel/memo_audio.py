"""Is an uploaded memo a real audio file of its declared type, at most 10 seconds? (issue 16 item 5)

Magic bytes are not enough: anything can start with ``OggS``. The memo is opened with FFmpeg's
demuxer for the declared container only (PyAV, the maintained FFmpeg bindings): the container's
header is parsed in full, it must hold exactly one stream and that stream must be audio in a codec
that container carries for browsers; then every packet is decoded, which proves the payload is
audio and gives its real duration (MediaRecorder's WebM has no duration in its header). A WebM is
also checked to declare DocType ``webm`` (the Matroska demuxer reads both). Decoding stops as soon
as the duration passes the limit, so a tiny file that claims hours costs nothing.

``publishable_memo`` (issue 27 item 1): a memo a judge agreed to publish, decoded and encoded
again as Ogg Opus, so that nothing of the upload's container reaches the open-data bundle: no
title, artist or creation time a recorder or browser wrote, no muxing or writing application,
no encoder version (FFmpeg's bitexact mode), only the sound.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

# Declared media type -> (file extension, FFmpeg demuxer, codecs accepted in it).
MEMO_CONTAINERS: dict[str, tuple[str, str, frozenset[str]]] = {
    "audio/webm": ("webm", "matroska", frozenset({"opus", "vorbis"})),
    "audio/ogg": ("ogg", "ogg", frozenset({"opus", "vorbis", "flac"})),
    "audio/mp4": ("m4a", "mp4", frozenset({"aac", "opus", "alac", "mp3"})),
    "audio/wav": ("wav", "wav", frozenset({"pcm_s16le", "pcm_s24le", "pcm_s32le", "pcm_f32le", "pcm_u8", "pcm_alaw", "pcm_mulaw"})),
}
# The browser stops at 10 s; its encoder may end on a frame boundary a little after (Opus: 20 ms).
DURATION_SLACK_S = 0.25


class MemoRejected(ValueError):
    """The upload is not an acceptable memo (one line, names why); ``status``: the HTTP answer."""

    status = 415


class MemoTooLong(MemoRejected):
    status = 413


@dataclass(frozen=True)
class MemoAudio:
    extension: str
    codec: str
    sample_rate: int
    duration_s: float


def _webm_doctype(data: bytes) -> str | None:
    """The DocType of the EBML header (first top-level element, ID 1A45DFA3)."""

    def vint(pos: int, keep_marker: bool) -> tuple[int, int]:
        first = data[pos]
        length = next((i + 1 for i in range(8) if first & (0x80 >> i)), 0)
        if not length or pos + length > len(data):
            raise MemoRejected("the memo is not audio/webm (bad EBML header)")
        value = first if keep_marker else first & (0xFF >> length)
        for b in data[pos + 1:pos + length]:
            value = (value << 8) | b
        return value, pos + length

    if data[:4] != b"\x1a\x45\xdf\xa3":
        return None
    size, pos = vint(4, keep_marker=False)
    end = pos + size
    if end > len(data):
        raise MemoRejected("the memo is not audio/webm (truncated EBML header)")
    while pos < end:
        eid, pos = vint(pos, keep_marker=True)
        esize, pos = vint(pos, keep_marker=False)
        if eid == 0x4282:  # DocType
            return data[pos:pos + esize].rstrip(b"\x00").decode("ascii", "replace")
        pos += esize
    return None


def check_memo(data: bytes, media_type: str, max_seconds: float) -> MemoAudio:
    """The memo's audio facts, or :class:`MemoRejected` saying why it is not acceptable."""
    import av

    if media_type not in MEMO_CONTAINERS:
        raise MemoRejected(f"memo type {media_type or 'missing'} not accepted (audio only)")
    ext, demuxer, codecs = MEMO_CONTAINERS[media_type]
    if media_type == "audio/webm" and _webm_doctype(data) != "webm":
        raise MemoRejected("the memo is not audio/webm (no EBML header with DocType webm)")
    limit = max_seconds + DURATION_SLACK_S
    try:
        with av.open(io.BytesIO(data), mode="r", format=demuxer) as container:
            streams = list(container.streams)
            if len(streams) != 1 or streams[0].type != "audio":
                kinds = ", ".join(s.type for s in streams) or "none"
                raise MemoRejected(f"the memo must hold exactly one audio stream (found: {kinds})")
            stream = streams[0]
            codec = stream.codec_context.name
            if codec not in codecs:
                raise MemoRejected(f"the memo's codec {codec} is not one {media_type} carries ({', '.join(sorted(codecs))})")
            samples, rate = 0, stream.codec_context.sample_rate or 0
            for packet in container.demux(stream):
                for frame in packet.decode():
                    rate = frame.sample_rate or rate
                    samples += frame.samples
                    if rate and samples / rate > limit:
                        raise MemoTooLong(f"the memo is longer than {max_seconds:g} seconds")
    except av.FFmpegError as exc:
        raise MemoRejected(f"the memo is not {media_type} audio ({exc.strerror or type(exc).__name__})") from None
    if not rate or samples == 0:
        raise MemoRejected(f"the memo is not {media_type} audio (no decodable sound)")
    return MemoAudio(ext, codec, rate, samples / rate)


PUBLISHED_MEMO_TYPE = ("ogg", "audio/ogg")  # extension and media type of a published memo
PUBLISHED_MEMO_RATE = 48000  # Opus's own rate; a memo is mixed down to one channel


def publishable_memo(data: bytes, media_type: str) -> bytes:
    """The memo's sound alone, as Ogg Opus (mono, 48 kHz, 48 kbit/s): a new container with no tag
    (container or stream metadata) and FFmpeg's version strings left out (``bitexact``), so the
    same upload always gives the same bytes. Raises :class:`MemoRejected` if it does not decode."""
    import av

    if media_type not in MEMO_CONTAINERS:
        raise MemoRejected(f"memo type {media_type or 'missing'} not accepted (audio only)")
    demuxer = MEMO_CONTAINERS[media_type][1]
    out = io.BytesIO()
    try:
        with av.open(io.BytesIO(data), mode="r", format=demuxer) as source, \
                av.open(out, mode="w", format="ogg", options={"fflags": "+bitexact"}) as target:
            audio = source.streams.audio[0]
            stream = target.add_stream("libopus", rate=PUBLISHED_MEMO_RATE)
            stream.layout = "mono"
            stream.bit_rate = 48000
            stream.codec_context.flags |= av.codec.context.Flags.bitexact
            for frame in source.decode(audio):
                frame.pts = None  # timing is the encoder's own: nothing of the upload's clock is kept
                for packet in stream.encode(frame):
                    target.mux(packet)
            for packet in stream.encode(None):
                target.mux(packet)
            target.metadata.clear()
            stream.metadata.clear()
    except (av.FFmpegError, IndexError) as exc:
        raise MemoRejected(f"the memo is not {media_type} audio ({getattr(exc, 'strerror', None) or type(exc).__name__})") from None
    return out.getvalue()
