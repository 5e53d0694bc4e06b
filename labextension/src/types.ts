/** Shapes of the SpotWarp server extension's REST API (`{base_url}spotwarp/api/`). */

export interface ISnapshotSummary {
  id: string;
  created: string;
  host: string;
  kind?: string;
  message?: string | null;
  size: number;
  bytes_written?: number | null;
  duration_s?: number | null;
  notebooks?: string[];
  variables?: string[];
  files?: number;
  parent?: string | null;
  signed?: boolean;
  age_s?: number;
}

export interface IKernelState {
  kernel_id: string;
  notebook: string | null;
  last_snapshot?: ISnapshotSummary | string | null;
}

export interface IWatcherState {
  name: string;
  state: string;
  [key: string]: unknown;
}

export interface IStatus {
  version: string;
  project: string;
  storage: string;
  workspace?: string;
  last_snapshot: ISnapshotSummary | null;
  kernels?: IKernelState[];
  watchers?: IWatcherState[];
  report?: Record<string, unknown> | null;
  /** Why the last automatic backup failed, if it did. */
  last_error?: string | null;
}

export interface ISnapshotList {
  snapshots: ISnapshotSummary[];
}

export interface IKernelRestore {
  kernel_id: string;
  notebook: string;
  restored?: string[];
  warnings?: string[];
  /** Why this kernel could not restore (e.g. SpotWarp not loaded in it). */
  error?: string;
}

export interface IRestoreResult {
  id: string;
  files_restored?: number;
  files_unchanged?: number;
  bytes_restored?: number;
  duration_s?: number;
  kernels?: IKernelRestore[];
}
