"""The committed snapshots of one project as a reader sees them: checked, cached, newest first, found by id.

A manifest that fails its checks (damaged, unsigned where a key is set, signed for another scope, of
another project) is never listed; it is remembered as rejected, with why. Without a key, `latest` never
falls back silently past it: the caller is told, and names an older snapshot instead. With a key, one that
does not parse or is not signed with it is a store writer's without the key: it is skipped (one logged
line, and shown in `rejected`), never blocks `latest`; the head record (engine.head) tells a missing real
snapshot from such junk.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from ..errors import ManifestError, ScopeError, SignatureError, SnapshotNotFound, UnreadableManifest
from ..settings import Settings
from ..storage import Store
from .files_record import resolve
from .manifest import Manifest

log = logging.getLogger("spotwarp")

_OLDER_HINT = "to restore an older snapshot, name it explicitly (its id from `spotwarp list`: --snapshot ID)"


def _refusal(exc: ManifestError) -> ManifestError:
    """The refusal of the newest snapshot, saying how to choose an older one instead of falling back."""
    if _OLDER_HINT in str(exc):
        return exc
    return type(exc)(f"{exc}; {_OLDER_HINT}")


class ManifestCatalog:
    """The manifests of one store, read once each and checked against the key, scope and project."""

    def __init__(self, store: Store, settings: Settings, key: bytes, scope: dict[str, Any]):
        self.store, self.settings, self.key, self.scope = store, settings, key, scope
        self._cache: dict[str, Manifest] = {}
        self.rejected: dict[str, str] = {}  # manifest name -> why it was refused
        self._rejections: dict[str, ManifestError] = {}
        self.valid: set[str] = set()  # names of the manifests the last listing accepted, before the screen
        self._skipped: set[str] = set()  # rejected names that are no one's with the key: they never block `latest`
        # drops manifests that must not count (SnapshotEngine: those written after the lease moved past them)
        self.screen: Callable[[list[Manifest]], list[Manifest]] | None = None

    def remember(self, manifest: Manifest) -> None:
        """A manifest this process committed: listed without reading it back."""
        self._cache[manifest.name] = manifest

    def forget(self, name: str) -> None:
        """A manifest this process deleted (gc)."""
        self._cache.pop(name, None)

    def manifests(self, notebook: str | None = None) -> list[Manifest]:
        """Committed snapshots, newest first (for one notebook's kernel when `notebook` is given): one LIST."""
        listing = self._list()
        return listing if notebook is None else of_notebook(listing, notebook)

    def _list(self) -> list[Manifest]:
        """Every committed snapshot, newest first: one LIST of the snapshots folder, new manifests read once."""
        names = self.store.manifest_names()
        for gone in set(self._rejections) - set(names):  # deleted since: no longer a reason to refuse
            del self._rejections[gone]
            self.rejected.pop(gone, None)
            self._skipped.discard(gone)
        out: list[Manifest] = []
        for name in names:
            manifest = self._cache.get(name)
            if manifest is None and name not in self.rejected:
                manifest = self._read(name)
            if manifest is not None:
                out.append(manifest)
        out.sort(key=lambda m: m.order, reverse=True)
        self.valid = {m.name for m in out}
        return self.screen(out) if self.screen is not None else out

    def _read(self, name: str) -> Manifest | None:
        """The manifest `name`, checked; None (remembering why) when refused or gone."""
        try:
            manifest = Manifest.from_bytes(self.store.read_manifest(name), name, self.key,
                                           require_signature=bool(self.key), scope=self.scope)
            manifest.files = resolve(self.store, manifest.files, manifest.objects, name)
        except FileNotFoundError:
            return None  # dropped by a concurrent gc
        except ManifestError as exc:
            self._rejections[name] = exc
            if self.key and isinstance(exc, (SignatureError, UnreadableManifest)) and not isinstance(exc, ScopeError):
                self._skipped.add(name)
                self.rejected[name] = f"skipped: {exc}"
                log.warning("SpotWarp: skipping %s, not signed with this SPOTWARP_KEY (never restored, never "
                            "`latest`): %s", name, exc)
            else:
                self.rejected[name] = str(exc)
                log.warning("%s", exc)
            return None
        if manifest.project != self.settings.project:
            exc = ManifestError(f"snapshot {manifest.id} belongs to project {manifest.project!r}, "
                                f"not {self.settings.project!r}: refusing it")
            self.rejected[name], self._rejections[name] = str(exc), exc
            return None
        self._cache[name] = manifest
        return manifest

    def get(self, ref: str = "latest", notebook: str | None = None, listing: list[Manifest] | None = None) -> Manifest:
        """A snapshot by `latest` (`notebook`'s newest when given), full id, or unique id prefix.

        `listing`: what `manifests()` just returned, so that one operation lists the store once.
        """
        ref = (ref or "latest").strip()
        every = self.manifests() if listing is None else listing
        if ref == "latest":
            listing = every if notebook is None else of_notebook(every, notebook)
            # never fall back silently past a snapshot that fails its checks: say why it was refused
            self.refuse_newer_than(listing[0] if listing else None)
            if not listing:
                where = f" for notebook {notebook!r}" if notebook else ""
                raise SnapshotNotFound(f"project {self.settings.project!r} has no snapshot{where} yet in {self.settings.storage}")
            return listing[0]
        if not ref.replace("-", "").isalnum() or len(ref) > 64:
            raise SnapshotNotFound(f"bad snapshot id {ref!r}: use an id from `spotwarp list`, or latest")
        for name, exc in self._rejections.items():
            if name.endswith(f"-{ref}.json"):
                raise exc
        matches = [m for m in every if m.id.startswith(ref)]
        if not matches:
            raise SnapshotNotFound(f"no snapshot {ref!r} in project {self.settings.project!r} (see `spotwarp list`)")
        if len(matches) > 1:
            raise SnapshotNotFound(f"snapshot id {ref!r} is ambiguous: {', '.join(m.id for m in matches)}")
        return matches[0]

    def refuse_newer_than(self, manifest: Manifest | None) -> None:
        """Raise the refusal of a snapshot newer than `manifest` (or any, for None) that fails its checks.

        `latest` never falls back silently past a damaged, unsigned or foreign snapshot: the caller names an older one.
        With a key, a manifest that does not parse or is not signed with it is skipped, never refused.
        """
        newer = [n for n in self._rejections if (manifest is None or n > manifest.name) and n not in self._skipped]
        if newer:
            raise _refusal(self._rejections[max(newer)])


def of_notebook(listing: list[Manifest], notebook: str) -> list[Manifest]:
    """The snapshots of `listing` that hold `notebook`'s kernel state, in the same order."""
    return [m for m in listing if notebook in m.kernels]
