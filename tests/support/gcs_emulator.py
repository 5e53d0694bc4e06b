"""gcp-storage-emulator, run as a script, with three changes that make it behave as GCS does.

- A longer listen queue. It answers one request at a time, from http.server's queue of 5 connections: a
  sixth opened at once is dropped and waits out TCP's 1 s SYN retry, a stall no real object store has
  (restoring the reference notebook spent 1.0 of its 1.1 s in one such request).
- A body cut short is refused. The emulator stored whatever part of a body had arrived when the client
  died mid-request, over the object already under that name; GCS creates or replaces an object only
  from a whole request.
- A multipart upload keeps its content byte for byte. The emulator parsed it with the e-mail parser,
  which takes a lone CR for a line ending: content that ended in b"\\r" lost that byte (gcsfs ends the
  content with a bare LF before the closing boundary), one object in 256 of random bytes.

Usage: python gcs_emulator.py start --host 127.0.0.1 --port PORT --in-memory
"""

from __future__ import annotations

import http.server
import json
import re
import sys
from typing import Any

import gcp_storage_emulator.server as emulator
from gcp_storage_emulator.__main__ import main

_original_read_data = emulator._read_data


def read_whole_body(handler: http.server.BaseHTTPRequestHandler) -> bytes | None:
    """The request's body, or ConnectionAbortedError when the client stopped sending before its end."""

    def take(n: int) -> bytes:
        data = handler.rfile.read(n)
        if len(data) < n:
            raise ConnectionAbortedError(f"request body cut off after {len(data)} of {n} bytes")
        return data

    length = handler.headers.get("Content-Length")
    if length:
        return take(int(length))
    if (handler.headers.get("Transfer-Encoding") or "").lower() != "chunked":
        return None
    chunks = []
    while True:
        line = handler.rfile.readline()
        if not line.endswith(b"\n"):
            raise ConnectionAbortedError("chunked request body cut off")
        size = int(line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return b"".join(chunks)
        chunks.append(take(size))
        take(2)  # the CRLF after each chunk


def related_parts(raw: bytes, content_type: str) -> dict[str, Any]:
    """A multipart/related upload as the emulator's handlers expect it: metadata, content, content type.

    Each part lies between two delimiters, and the line break before a delimiter belongs to the delimiter
    (RFC 2046): exactly one is taken off each part's end, in the sender's style (gcsfs sends LF, others CRLF,
    which the line after the first delimiter shows), and nothing else is changed.
    """
    found = re.search(r'boundary="?([^";]+)"?', content_type)
    if not found:
        raise ValueError(f"multipart upload without a boundary: {content_type!r}")
    delimiter = b"--" + found.group(1).encode()
    if (first := raw.find(delimiter)) < 0:
        raise ValueError("multipart upload without its boundary in the body")
    start = first + len(delimiter)
    brk = b"\r\n" if raw[start:start + 2] == b"\r\n" else b"\n"
    parts = []
    for piece in raw[start:].split(brk + delimiter)[:-1]:
        if not piece.startswith(brk):
            raise ValueError("multipart upload with a malformed delimiter line")
        piece = piece[len(brk):]
        ends = [(i, len(sep)) for sep in (b"\r\n\r\n", b"\n\n") if (i := piece.find(sep)) >= 0]
        if not ends:
            raise ValueError("multipart upload part without headers")
        at, width = min(ends)
        headers = dict(line.split(":", 1) for line in piece[:at].decode("latin-1").splitlines() if ":" in line)
        headers = {k.strip().lower(): v.strip() for k, v in headers.items()}
        parts.append((headers.get("content-type", "application/octet-stream"), piece[at + width:]))
    if len(parts) != 2:
        raise ValueError(f"multipart upload with {len(parts)} parts (metadata and content expected)")
    return {"meta": json.loads(parts[0][1]), "content": parts[1][1],
            "content-type": parts[1][0].split(";")[0].strip().lower()}


def read_data(handler: http.server.BaseHTTPRequestHandler, query: dict) -> Any:
    content_type = handler.headers.get("Content-Type") or ""
    if not content_type.startswith("multipart/related"):
        return _original_read_data(handler, query)
    raw = emulator._decode_raw_data(read_whole_body(handler), handler)
    return related_parts(raw, content_type) if raw else None


http.server.HTTPServer.request_queue_size = 128
emulator._read_raw_data = read_whole_body
emulator._read_data = read_data

if __name__ == "__main__":
    main(sys.argv[1:])
