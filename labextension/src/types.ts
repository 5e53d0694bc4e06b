/**
 * Shapes of the SpotWarp server extension's REST API (`{base_url}spotwarp/api/`), taken from the
 * types that `jlpm schema` generates from api/openapi.yaml into schema.ts (a test keeps them in step).
 */

import { components } from './schema';

type Schemas = components['schemas'];

export type ISnapshotSummary = Schemas['SnapshotSummary'] & { age_s?: number };
export type IStatus = Schemas['Status'];
export type IKernelState = IStatus['kernels'][number];
export type IWatcherState = Schemas['Watcher'];
export type IReport = Schemas['Report'];
export type IReportRow = Schemas['ReportRow'];
export type IResumeEntry = Schemas['ResumeEntry'];
export type IResumeRow = Schemas['ResumeRow'];
export type IRestoreResult = Schemas['RestoreResult'];
export type IKernelRestore = IRestoreResult['kernels'][number];

export interface ISnapshotList {
  snapshots: ISnapshotSummary[];
}
