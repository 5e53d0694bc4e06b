/** An in-memory stand-in for the SpotWarp REST API, in the shape of `requestAPI`. */

import { ApiError, RequestFn } from '../request';
import { ISnapshotSummary, IStatus } from '../types';

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

export class FakeServer {
  version = '0.1.0';
  missing = false;
  failNext: ApiError | null = null;
  calls: string[] = [];
  snapshots: ISnapshotSummary[] = [];
  report: Record<string, unknown> | null = null;
  lastError: string | null = null;
  kernelError: string | null = null;
  private _n = 0;

  status(): IStatus {
    return {
      version: this.version,
      project: 'proj',
      storage: 'gs://bucket/spotwarp',
      workspace: '/work/ws',
      last_snapshot: this.snapshots[0] ?? null,
      kernels: [{ kernel_id: 'k1', notebook: 'train.ipynb', last_snapshot: this.snapshots[0] ?? null }],
      watchers: [
        { name: 'sigterm', state: 'watching', endpoint: null, last_notice: null },
        { name: 'aws', state: 'off: not on AWS (no instance metadata at 169.254.169.254)', endpoint: 'http://169.254.169.254' },
        { name: 'gcp', state: 'watching', last_notice: { kind: 'preempted', seen: 1, fatal: true, window_s: 30 } }
      ],
      last_error: this.lastError,
      ...(this.report ? { report: this.report } : {})
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
    throw new ApiError(404, `no route ${method} ${endPoint}`);
  };
}
