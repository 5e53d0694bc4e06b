import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';

import { messageOf, SpotWarpModel } from './model';
import { formatDuration, formatTime } from './format';
import { ISnapshotSummary } from './types';

/** Ask the user; resolves true to go ahead. Replaced by a fake in tests. */
export type ConfirmFn = (title: string, body: string, label: string) => Promise<boolean>;

export const confirmWithDialog: ConfirmFn = async (title, body, label) => {
  const result = await showDialog({
    title,
    body,
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label })]
  });
  return result.button.accept;
};

/** Snapshot-now and restore, each behind a confirmation, with the outcome as a notification. */
export class SpotWarpActions {
  constructor(
    readonly model: SpotWarpModel,
    readonly confirm: ConfirmFn = confirmWithDialog,
    readonly notify: (kind: 'success' | 'error', text: string) => void = defaultNotify
  ) {}

  async snapshotNow(): Promise<string | null> {
    const ok = await this.confirm(
      'Take a SpotWarp snapshot?',
      'Workspace files, notebooks and the state of every running kernel are written to storage now.',
      'Snapshot'
    );
    if (!ok) {
      return null;
    }
    try {
      const id = await this.model.snapshotNow();
      this.notify('success', `SpotWarp snapshot ${id} committed.`);
      return id;
    } catch (error) {
      this.notify('error', `SpotWarp snapshot failed: ${messageOf(error)}`);
      return null;
    }
  }

  async restore(snapshot: ISnapshotSummary): Promise<boolean> {
    const ok = await this.confirm(
      `Restore snapshot ${snapshot.id}?`,
      `From ${snapshot.host}, ${formatTime(snapshot.created)}. Workspace files are overwritten with the ` +
        "snapshot's, and kernels running its notebooks get its variables back.",
      'Restore'
    );
    if (!ok) {
      return false;
    }
    try {
      const result = await this.model.restore(snapshot.id);
      const kernels = result.kernels ?? [];
      const restored = kernels.filter(k => !k.error).length;
      const failed = kernels.filter(k => k.error).map(k => `${k.notebook}: ${k.error}`);
      const text =
        `Restored ${result.id}: ${result.files_restored ?? 0} files, ` +
        `${restored} kernel${restored === 1 ? '' : 's'}` +
        (result.duration_s !== undefined ? ` in ${formatDuration(result.duration_s)}` : '') +
        '.';
      this.notify(failed.length ? 'error' : 'success', failed.length ? `${text} Not restored: ${failed.join('; ')}` : text);
      return true;
    } catch (error) {
      this.notify('error', `SpotWarp restore failed: ${messageOf(error)}`);
      return false;
    }
  }

  /**
   * One click: run the cell interrupted outside a resumable loop again, in the notebook's resumed
   * kernel (its outputs go into the notebook). No confirmation: the panel's button names the cell.
   */
  async runInterrupted(notebook: string): Promise<boolean> {
    try {
      const entry = await this.model.runInterrupted(notebook);
      this.notify('success', `SpotWarp: cell ${entry.cell ?? ''} of ${notebook} is running again in its resumed kernel.`);
      return true;
    } catch (error) {
      this.notify('error', `SpotWarp: the interrupted cell of ${notebook} was not run: ${messageOf(error)}`);
      return false;
    }
  }

  /** Restore the newest snapshot of the project. */
  async restoreLatest(): Promise<boolean> {
    if (!this.model.snapshots.length) {
      await this.model.refresh();
    }
    const latest = this.model.snapshots[0];
    if (!latest) {
      this.notify('error', 'SpotWarp: this project has no snapshot to restore yet.');
      return false;
    }
    return this.restore(latest);
  }
}

function defaultNotify(kind: 'success' | 'error', text: string): void {
  if (kind === 'success') {
    Notification.success(text, { autoClose: 5000 });
  } else {
    Notification.error(text, { autoClose: false });
  }
}
