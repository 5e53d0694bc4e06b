"""`verify`: re-read and re-hash every object of one snapshot (or all), collecting every problem found."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import SpotWarpError
from .manifests import ManifestCatalog
from .storage import Store


@dataclass
class VerifyReport:
    """The outcome of re-reading and re-hashing snapshots."""

    snapshots: list[str] = field(default_factory=list)
    objects_checked: int = 0
    bytes_checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_snapshots(store: Store, catalog: ManifestCatalog, ref: str | None = None) -> VerifyReport:
    """Re-read and re-hash every object of snapshot `ref` (or of all); manifests refused count as problems."""
    report = VerifyReport()
    manifests = [catalog.get(ref)] if ref else catalog.manifests()
    for name, reason in catalog.rejected.items():
        report.problems.append(f"manifest {name}: {reason}")
    referenced: dict[str, list[str]] = {}
    for m in manifests:
        report.snapshots.append(m.id)
        for oid in m.objects:
            referenced.setdefault(oid, []).append(m.id)
    sizes = {oid: size for m in manifests for oid, size in m.objects.items()}
    for oid, snapshot_ids in sorted(referenced.items()):
        try:
            store.read_object(oid, sizes[oid])
        except SpotWarpError as exc:
            report.problems.append(f"{exc} [snapshots {', '.join(sorted(set(snapshot_ids)))}]")
            continue
        report.objects_checked += 1
        report.bytes_checked += sizes[oid]
    return report
