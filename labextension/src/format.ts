/** Sizes, durations, times and "what changed" as people read them. */

import { ISnapshotSummary } from './types';
// formatSize and formatDuration are shared with the notebook's status widget: one plain ES module in
// the Python package, bundled here by webpack and served there by status.py. Their behaviour for odd
// input (NaN, null, negative, Infinity, ...) is described in that file and tested in format.spec.ts.
import { formatDuration, formatSize } from '../../spotwarp_jupyter/widget/format.js';

export { formatDuration, formatSize };

export function formatAge(iso: string, now: number = Date.now()): string {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) {
    return '';
  }
  const s = Math.max(0, (now - t) / 1000);
  if (s < 60) {
    return `${Math.floor(s)} s ago`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)} min ago`;
  }
  if (s < 86400) {
    return `${Math.floor(s / 3600)} h ago`;
  }
  return `${Math.floor(s / 86400)} d ago`;
}

export function formatTime(iso: string): string {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) {
    return iso;
  }
  return d.toISOString().replace('T', ' ').slice(0, 19) + ' UTC';
}

function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}

/**
 * What a snapshot changed compared with the one before it (the next older in the list).
 */
export function describeChange(
  snapshot: ISnapshotSummary,
  older?: ISnapshotSummary
): string {
  const parts: string[] = [];
  const vars = snapshot.variables ?? [];
  if (older) {
    const before = new Set(older.variables ?? []);
    const now = new Set(vars);
    const added = vars.filter(v => !before.has(v));
    const removed = [...before].filter(v => !now.has(v));
    if (added.length) {
      parts.push(`+${added.slice(0, 3).join(', ')}${added.length > 3 ? ` +${added.length - 3} more` : ''}`);
    }
    if (removed.length) {
      parts.push(`−${removed.slice(0, 3).join(', ')}${removed.length > 3 ? ` −${removed.length - 3} more` : ''}`);
    }
    const files = (snapshot.files ?? 0) - (older.files ?? 0);
    if (files) {
      parts.push(`${files > 0 ? '+' : '−'}${plural(Math.abs(files), 'file')}`);
    }
  } else {
    parts.push('first snapshot');
  }
  parts.push(`wrote ${formatSize(snapshot.bytes_written ?? 0)}`);
  if (snapshot.duration_s !== null && snapshot.duration_s !== undefined) {
    parts.push(`in ${formatDuration(snapshot.duration_s)}`);
  }
  return parts.join(' · ');
}

/**
 * The snapshot `describeChange` compares with: the next older one of the same kind, and for kernel
 * snapshots one of the same notebook (a files snapshot and a kernel snapshot hold different things).
 */
export function previousOf(snapshots: ISnapshotSummary[], index: number): ISnapshotSummary | undefined {
  const current = snapshots[index];
  const notebooks = new Set(current.notebooks ?? []);
  return snapshots.slice(index + 1).find(
    s =>
      (s.kind ?? '') === (current.kind ?? '') &&
      (!notebooks.size || (s.notebooks ?? []).some(n => notebooks.has(n)))
  );
}

/** What a snapshot holds: notebooks, variables and files. */
export function describeContents(snapshot: ISnapshotSummary): string {
  const parts: string[] = [];
  const notebooks = snapshot.notebooks ?? [];
  if (notebooks.length) {
    parts.push(notebooks.join(', '));
  }
  parts.push(plural((snapshot.variables ?? []).length, 'variable'));
  parts.push(plural(snapshot.files ?? 0, 'file'));
  return parts.join(' · ');
}
