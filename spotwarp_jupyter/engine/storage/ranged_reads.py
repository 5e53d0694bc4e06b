"""Ranged GETs from an object store, each response body streamed straight into its place in the destination.

fsspec's `cat_ranges` hands each range back as one bytes object: aiohttp joins the body's pieces into new
memory, every page of it faulted in, and a restore then copied that into its destination, populated already.
Streaming the pieces into the destination instead costs one copy of each piece and no new memory: 191 MB
from the GCS emulator took 0.34 s of client CPU this way against 0.63 s (plain `cat_ranges` alone: 0.29).

The readers use the filesystem's own session, credentials, request timeout and error translation (gcsfs's
aiohttp session and headers; s3fs's botocore client, its retries and `translate_boto_error`). Where an
installed gcsfs or s3fs lacks those parts, `range_reader` gives None and the store reads with `cat_ranges`.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Awaitable, Callable

from fsspec.asyn import sync

# reader(path, start, end, view) -> bytes the body had: len(view) + 1 when it had more than `view` holds
RangeReader = Callable[[str, int, int, memoryview], Awaitable[int]]


def range_reader(fs: Any, protocol: str) -> RangeReader | None:
    """The streaming reader for `fs` (gcsfs or s3fs), None when this filesystem has none."""
    if protocol in ("gs", "gcs") and all(hasattr(fs, a) for a in ("_set_session", "_get_headers", "_get_params")):
        try:
            from gcsfs.retry import validate_response  # noqa: F401
        except ImportError:
            return None
        return functools.partial(_gcs_range_into, fs)
    if protocol in ("s3", "s3a") and hasattr(fs, "_call_s3"):
        try:
            from s3fs.core import _error_wrapper, version_id_kw  # noqa: F401
        except ImportError:
            return None
        return functools.partial(_s3_range_into, fs)
    return None


def read_ranges_into(fs: Any, reader: RangeReader, path: str, starts: list[int], ends: list[int],
                     views: list[memoryview], timeout: float | None = None) -> list[int]:
    """GET bytes [start, end) of `path` into each view, all ranges at once on fsspec's event loop; how many bytes
    each body had. When one range fails, or `timeout` passes, the others are cancelled and awaited before the
    error is raised, so nothing writes into the views after this returns."""

    async def every_range() -> list[int]:
        tasks = [asyncio.ensure_future(reader(path, s, e, v)) for s, e, v in zip(starts, ends, views)]
        try:
            return list(await asyncio.wait_for(asyncio.gather(*tasks), timeout))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    return sync(fs.loop, every_range)  # a timeout inside, so the ranges are cancelled before this returns


async def _gcs_range_into(fs: Any, path: str, start: int, end: int, view: memoryview) -> int:
    from gcsfs.retry import validate_response

    await fs._set_session()
    async with fs.session.get(url=fs.url(path), params=fs._get_params({}),
                              headers=fs._get_headers({"Range": f"bytes={start}-{end - 1}"}),
                              timeout=fs.requests_timeout) as response:
        if response.status == 416:
            return 0  # the range starts past the object's end: it is shorter than asked
        if response.status >= 400:
            validate_response(response.status, await response.read(), path)  # gcsfs's error for the status
        if response.status != 206:
            raise ValueError(f"the server ignored the byte range asked of {path} (HTTP {response.status})")
        received = 0
        while chunk := await response.content.readany():
            if received + len(chunk) > len(view):
                return len(view) + 1
            view[received:received + len(chunk)] = chunk
            received += len(chunk)
        return received


async def _s3_range_into(fs: Any, path: str, start: int, end: int, view: memoryview) -> int:
    from botocore.exceptions import ClientError
    from s3fs.core import _error_wrapper, version_id_kw

    bucket, key, version = fs.split_path(path)

    async def get() -> int:
        try:
            response = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}",
                                         **version_id_kw(version))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "InvalidRange":
                return 0  # the range starts past the object's end
            raise
        body = response["Body"]
        try:
            received = 0
            while received < len(view):
                n = await body.readinto(view[received:])
                if not n:
                    return received
                received += n
            return len(view) + 1 if await body.read(1) else received
        finally:
            body.close()

    return await _error_wrapper(get, retries=fs.retries)
