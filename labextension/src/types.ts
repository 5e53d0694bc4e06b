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
  notebook: string;
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
}

export interface ISnapshotList {
  snapshots: ISnapshotSummary[];
}

export interface IRestoreResult {
  id: string;
  files_restored?: number;
  kernels?: unknown[];
}
