/**
 * An in-memory stand-in for the SpotWarp REST API, in the shape of `requestAPI`. Its answers are
 * typed by the types generated from api/openapi.yaml, so it cannot answer what the server never would.
 */

import { ApiError, RequestFn } from '../request';
import { IReport, IReportRow, IResumeEntry, ISnapshotSummary, IStatus } from '../types';

export function snapshot(over: Partial<ISnapshotSummary> = {}): ISnapshotSummary {
  return {
    id: 'a1b2c3d4',
    created: '2026-12-02T10:00:00.000Z',
    host: 'spot-a',
    kind: 'kernel',
    message: null,
    size: 1_500_000,
    bytes_written: 250_000,
    duration_s: 0.42,
    notebooks: ['train.ipynb'],
    variables: ['model', 'opt'],
    files: 3,
    parent: null,
    signed: false,
    ...over
  };
}

export function emptyReport(): IReport {
  return {
    preemptions: 0,
    preemptions_survived: 0,
    work_lost_s: 0,
    resume_s_median: null,
    compute_saved_s: 0,
    warnings: 0,
    events: [],
    failovers: []
  };
}

/** One preemption as the journal's report lists it: spot-a lost to an AWS notice, resumed on spot-b. */
export function preemption(over: Partial<IReportRow> = {}): IReportRow {
  return {
    time: '2026-12-02T10:30:00.000Z',
    with_notice: true,
    notice: '2026-12-02T10:30:00.000Z',
    host: 'spot-a',
    source: 'aws',
    final_snapshot: 'f1n4l000',
    notice_to_final_s: 2.1,
    restored_snapshot: 'f1n4l000',
    restored_on: 'spot-b',
    survived: true,
    work_lost_s: 3.5,
    resume_s: 12,
    compute_saved_s: 5400,
    resumed_at_step: 1234,
    ...over
  };
}

export class FakeServer {
  version = '0.1.0';
  missing = false;
  failNext: ApiError | null = null;
  calls: string[] = [];
  snapshots: ISnapshotSummary[] = [];
  report: IReport = emptyReport();
  lastError: string | null = null;
  kernelError: string | null = null;
  /** GET status's `resume`: what resuming each notebook did on this host. */
  resume: IResumeEntry[] = [];
  private _n = 0;

  status(): IStatus {
    return {
      version: this.version,
      project: 'proj',
      storage: 'gs://bucket/spotwarp',
      workspace: '/work/ws',
      last_snapshot: this.snapshots[0] ? { ...this.snapshots[0], age_s: 12 } : null,
      kernels: [
        {
          kernel_id: 'k1',
          notebook: 'train.ipynb',
          last_snapshot: this.snapshots[0]?.id ?? null,
          execution_state: 'idle',
          newer: null
        }
      ],
      watchers: [
        { name: 'sigterm', state: 'watching', endpoint: null, last_notice: null },
        {
          name: 'aws',
          state: 'off: not on AWS (no instance metadata at 169.254.169.254)',
          endpoint: 'http://169.254.169.254',
          last_notice: null
        },
        {
          name: 'gcp',
          state: 'watching',
          endpoint: 'http://metadata.google.internal',
          last_notice: { kind: 'preempted', seen: 1, fatal: true, window_s: 30 }
        }
      ],
      last_error: this.lastError,
      start_restore: null,
      report: this.report,
      resume: this.resume.map(e => ({ ...e }))
    };
  }

  request: RequestFn = async <T>(endPoint = '', init: RequestInit = {}): Promise<T> => {
    const method = init.method ?? 'GET';
    this.calls.push(`${method} ${endPoint}`);
    if (this.missing) {
      throw new ApiError(404, 'Not Found');
    }
    if (this.failNext) {
      const error = this.failNext;
      this.failNext = null;
      throw error;
    }
    if (method === 'GET' && endPoint === 'status') {
      return this.status() as T;
    }
    if (method === 'GET' && endPoint === 'snapshots') {
      return { snapshots: [...this.snapshots] } as T;
    }
    if (method === 'POST' && endPoint === 'snapshots') {
      const body = JSON.parse(String(init.body ?? '{}'));
      this._n += 1;
      const s = snapshot({
        id: `new${this._n}`,
        created: new Date(Date.UTC(2026, 11, 2, 11, this._n)).toISOString(),
        message: body.message ?? null,
        parent: this.snapshots[0]?.id ?? null
      });
      this.snapshots.unshift(s);
      return { id: s.id } as T;
    }
    const m = /^snapshots\/([^/]+)\/restore$/.exec(endPoint);
    if (method === 'POST' && m) {
      const id = decodeURIComponent(m[1]);
      if (!this.snapshots.some(s => s.id === id)) {
        throw new ApiError(404, `no snapshot '${id}' in project 'proj'`);
      }
      const kernel = this.kernelError
        ? { kernel_id: 'k1', notebook: 'train.ipynb', restored: [], error: this.kernelError }
        : { kernel_id: 'k1', notebook: 'train.ipynb', restored: ['model', 'opt'] };
      return { id, files_restored: 3, duration_s: 1.25, kernels: [kernel] } as T;
    }
    if (method === 'POST' && endPoint === 'resume/run') {
      const notebook = JSON.parse(String(init.body ?? '{}')).notebook;
      const entry = this.resume.find(e => e.notebook === notebook);
      if (!entry) {
        throw new ApiError(404, `${notebook}: not resumed on this host (see resume in GET status)`);
      }
      if (!entry.interrupted_cell || entry.state !== 'restored') {
        throw new ApiError(409, `${notebook}: no interrupted cell waits to run (state ${entry.state})`);
      }
      entry.cell = entry.interrupted_cell;
      entry.state = 'running';
      delete entry.interrupted_cell;
      return { ...entry } as T;
    }
    throw new ApiError(404, `no route ${method} ${endPoint}`);
  };
}

/** A notebook whose training cell the server ran again after restoring it (state `running`). */
export function rerun(over: Partial<IResumeEntry> = {}): IResumeEntry {
  return {
    notebook: 'train.ipynb',
    state: 'running',
    line: "train.ipynb: restored from snapshot k7m2qx9a (spot-a, 2026-12-02T10:29:58Z); re-running cell c3 from step 5 of loop 'train'",
    kernel_id: 'k1',
    snapshot: 'k7m2qx9a',
    positions: { train: 5 },
    cell: 'c3',
    kernel_started_s: 3.1,
    state_restored_s: 4.0,
    seconds_to_running: 4.2,
    ...over
  };
}

/** A notebook restored with a cell that was interrupted outside a resumable loop (not run again). */
export function interrupted(over: Partial<IResumeEntry> = {}): IResumeEntry {
  return {
    notebook: 'etl.ipynb',
    state: 'restored',
    line: 'etl.ipynb: restored from snapshot e1e1e1e1 (spot-a, ...); cell load was running (outside a resumable loop): not run again, run it yourself',
    kernel_id: 'k2',
    snapshot: 'e1e1e1e1',
    positions: {},
    interrupted_cell: 'load',
    kernel_started_s: 3.0,
    state_restored_s: 3.6,
    ...over
  };
}
