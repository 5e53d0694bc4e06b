"""Storage failures: which are worth retrying, how patiently, and the one-line error when attempts are spent."""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any, Callable, TypeVar

from ..errors import DamagedObjectError, StorageError, one_line
from ..settings import env_float, env_int

log = logging.getLogger("spotwarp")
T = TypeVar("T")


_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError,
              ValueError, TypeError, KeyError, AttributeError, NotImplementedError, DamagedObjectError, StorageError)


_TRANSIENT_WORDS = ("connect", "timeout", "disconnect", "payload", "throttl", "unavailable", "incomplete",
                    "reset", "protocolerror", "chunkedencoding", "brokenpipe")


def is_transient(exc: BaseException) -> bool:
    """True for failures worth retrying: connection trouble, timeouts, throttling, server errors."""
    code = getattr(exc, "code", None) or getattr(exc, "status", None)
    if isinstance(code, int) and 400 <= code < 600:
        return code in (408, 429) or code >= 500
    if isinstance(exc, _PERMANENT):
        return False
    if isinstance(exc, (OSError, TimeoutError, ConnectionError)):
        return True  # socket errors, and s3fs's translation of 5xx / SlowDown
    # backend exception types (botocore, aiohttp, requests) we cannot import without requiring them
    names = " ".join(t.__name__.lower() for t in type(exc).__mro__)
    return any(word in names for word in _TRANSIENT_WORDS)


class RetryPolicy:
    """How often and how patiently a storage call is retried (SPOTWARP_STORAGE_RETRIES / _BACKOFF)."""

    def __init__(self, attempts: int = 3, backoff_s: float = 0.5, max_backoff_s: float = 8.0):
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s

    @classmethod
    def from_env(cls) -> "RetryPolicy":
        """Attempts per call from SPOTWARP_STORAGE_RETRIES (default 3), first pause from SPOTWARP_STORAGE_BACKOFF."""
        return cls(env_int("SPOTWARP_STORAGE_RETRIES", 3, 1), env_float("SPOTWARP_STORAGE_BACKOFF", 0.5))

    def pause(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based): exponential, with jitter."""
        return min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)


def call_with_retries(url: str, retry: RetryPolicy, what: str, fn: Callable[..., T], *args: Any,
                      cancel: threading.Event | None = None, failed: str | None = None,
                      attempts: int | None = None, **kwargs: Any) -> T:
    """Run one storage operation on `url`, retrying transient failures; StorageError when attempts are spent."""
    failed = failed or f"failed while {what}"
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn(*args, **kwargs)
        except (FileNotFoundError, FileExistsError, DamagedObjectError, StorageError):
            raise  # FileExistsError: a create-only write found the name taken (the caller decides)
        except PermissionError as exc:
            raise StorageError(f"storage {url!r} refuses access (check credentials) while {what}: "
                               f"{one_line(exc)}") from None
        except Exception as exc:  # noqa: BLE001
            if not is_transient(exc) or attempt >= (attempts or retry.attempts) or (cancel is not None and cancel.is_set()):
                tries = f" after {attempt} attempts" if attempt > 1 else ""
                raise StorageError(f"storage {url!r} {failed}{tries}: {one_line(exc)}") from None
            pause = retry.pause(attempt)
            log.info("storage %s: %s failed (%s); retry %d in %.1fs", url, what, one_line(exc), attempt, pause)
            if cancel is not None:
                if cancel.wait(pause):
                    raise StorageError(f"storage {url!r} {failed}: {one_line(exc)}") from None
            else:
                time.sleep(pause)
