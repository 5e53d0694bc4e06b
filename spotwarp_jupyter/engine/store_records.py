"""Manifests, locks and housekeeping: the small records of a Store beside its objects."""

from __future__ import annotations

import os
import posixpath
import time
from typing import Any, Iterator

from .local_files import TEMPORARY_GRACE_S, TMP_MARK, stale_temporaries
from .retries import log, modified

MANIFEST_SUFFIX = ".json"


class StoreRecords:
    """The snapshots/ and locks/ areas of a Store (mixed into Store, which provides fs, _call and the paths)."""

    fs: Any
    url: str
    root: str
    local: bool
    objects_dir: str
    snapshots_dir: str
    locks_dir: str
    _swept: bool
    _call: Any
    _write_local: Any

    # -- manifests ------------------------------------------------------------------------
    def manifest_names(self) -> list[str]:
        """Names of committed manifests, oldest first (names sort by creation time)."""
        self.fs.invalidate_cache(self.snapshots_dir)
        try:
            names = self._call("listing snapshots", self.fs.ls, self.snapshots_dir, detail=False)
        except FileNotFoundError:
            return []
        out = [posixpath.basename(n.rstrip("/")) for n in names]
        return sorted(n for n in out if n.endswith(MANIFEST_SUFFIX) and TMP_MARK not in n)

    def read_manifest(self, name: str) -> bytes:
        """The stored bytes of manifest `name` (FileNotFoundError if a gc dropped it meanwhile)."""
        return self._call("reading a manifest", self.fs.cat_file, posixpath.join(self.snapshots_dir, name))

    def write_manifest(self, name: str, data: bytes) -> None:
        """Commit: a single atomic write (rename on local disks, one PUT on object stores).

        A retried PUT writes the same bytes again, so a lost reply cannot commit anything different.
        """
        path = posixpath.join(self.snapshots_dir, name)
        if self.local:
            self._write_local("committing a manifest", path, data)
        else:
            self._call("committing a manifest", self.fs.pipe_file, path, data)

    def delete_manifest(self, name: str) -> None:
        """Drop a committed manifest (gc); its objects stay until nothing names them."""
        try:
            self._call("deleting a manifest", self.fs.rm, posixpath.join(self.snapshots_dir, name))
        except FileNotFoundError:
            pass

    # -- locks (leases.py) -------------------------------------------------------------------
    def put_lock(self, name: str, data: bytes) -> None:
        """Write (or refresh) one lock object."""
        path = posixpath.join(self.locks_dir, name)
        if self.local:
            self._write_local("writing a lock", path, data)
        else:
            self._call("writing a lock", self.fs.pipe_file, path, data)

    def list_locks(self) -> dict[str, float | None]:
        """Every lock object: name -> when it was last written (epoch seconds, if known)."""
        if self.local:
            out: dict[str, float | None] = {}
            try:
                names = os.listdir(self.locks_dir)
            except FileNotFoundError:
                return out
            for name in names:
                if TMP_MARK in name or not name.endswith(".json"):
                    continue
                try:
                    out[name] = os.stat(os.path.join(self.locks_dir, name)).st_mtime
                except FileNotFoundError:
                    continue
            return out
        self.fs.invalidate_cache(self.locks_dir)
        try:
            listing = self._call("listing locks", self.fs.ls, self.locks_dir, detail=True)
        except FileNotFoundError:
            return {}
        return {posixpath.basename(i["name"].rstrip("/")): modified(i) for i in listing
                if i.get("type") != "directory" and i["name"].endswith(".json")}

    def delete_lock(self, name: str) -> None:
        """Remove one lock object (gone already is fine)."""
        try:
            self._call("removing a lock", self.fs.rm, posixpath.join(self.locks_dir, name))
        except FileNotFoundError:
            pass

    # -- housekeeping ---------------------------------------------------------------------
    def stale_temporaries(self, older_than_s: float = TEMPORARY_GRACE_S) -> Iterator[str]:
        """Leftovers of interrupted local writes: old enough, or left by a process of this host that is gone.

        Object stores leave no temporaries (uploads are invisible until complete); their interrupted
        multipart uploads are cleared by `clear_interrupted_uploads`.
        """
        if not self.local:
            return iter(())
        return stale_temporaries((self.objects_dir, self.snapshots_dir, self.locks_dir), older_than_s)

    def sweep_temporaries(self) -> int:
        """Remove stale temporaries of interrupted local writes, once per Store (the first write); how many."""
        if not self.local or self._swept:
            return 0
        self._swept = True
        removed = 0
        for path in list(self.stale_temporaries()):
            try:
                os.unlink(path)
                removed += 1
            except OSError:
                continue
        if removed:
            log.info("storage %s: removed %d temporaries of interrupted writes", self.url, removed)
        return removed

    def interrupted_uploads(self) -> list[dict[str, Any]]:
        """Unfinished multipart uploads under this project (S3 only; they hold storage until aborted)."""
        lister = getattr(self.fs, "list_multipart_uploads", None)
        if lister is None:
            return []
        bucket, _, prefix = self.root.partition("/")
        uploads = self._call("listing interrupted uploads", lister, bucket)
        mine = prefix + "/" if prefix else ""
        return [u for u in uploads if str(u.get("Key", "")).startswith(mine)]

    def clear_interrupted_uploads(self, older_than_s: float = 3600.0) -> int:
        """Abort multipart uploads older than `older_than_s` (no live writer still owns them); return how many."""
        aborter = getattr(self.fs, "abort_mpu", None)
        if aborter is None:
            return 0
        bucket = self.root.split("/")[0]
        now = time.time()
        cleared = 0
        for upload in self.interrupted_uploads():
            started = modified({"created": upload.get("Initiated")})
            if started is not None and now - started < older_than_s:
                continue
            try:
                self._call("aborting an interrupted upload", aborter, bucket, upload["Key"], upload["UploadId"])
            except FileNotFoundError:
                pass
            cleared += 1
        return cleared
