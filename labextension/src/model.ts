import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';
import { IDisposable } from '@lumino/disposable';
import { ServerConnection } from '@jupyterlab/services';

import { ApiError, RequestFn, requestAPI } from './request';
import { IRestoreResult, IResumeEntry, ISnapshotList, ISnapshotSummary, IStatus } from './types';

/** Whether the panel can talk to a server extension of its own version. */
export type ServerState = 'checking' | 'ok' | 'missing' | 'mismatch' | 'error';

export interface ISpotWarpModelOptions {
  /** The frontend's version; the server extension must report the same. */
  version: string;
  /** The REST client (a fake one in tests). */
  request?: RequestFn;
  /** Seconds between refreshes while the panel is visible. */
  refreshInterval?: number;
}

/**
 * The panel's view of the SpotWarp server: status and snapshots, refreshed by a poll that
 * stands by while the panel is hidden, and the two actions (snapshot now, restore).
 */
export class SpotWarpModel implements IDisposable {
  constructor(options: ISpotWarpModelOptions) {
    this.version = options.version;
    this._request = options.request ?? requestAPI;
    this._poll = new Poll({
      auto: false,
      factory: () => this.refresh(true),
      frequency: {
        interval: (options.refreshInterval ?? 10) * 1000,
        backoff: true,
        max: 300 * 1000
      },
      name: 'spotwarp:model',
      standby: () => (this._visible ? 'when-hidden' : true)
    });
  }

  readonly version: string;
  status: IStatus | null = null;
  snapshots: ISnapshotSummary[] = [];
  server: ServerState = 'checking';
  serverMessage = '';
  /** The last refresh's error, one line; null when the last refresh worked. */
  error: string | null = null;
  busy: '' | 'snapshot' | 'restore' | 'run' = '';

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  get poll(): Poll {
    return this._poll;
  }

  /** Tell the model whether anyone is looking, so polling stands by when not. */
  set visible(visible: boolean) {
    if (visible === this._visible) {
      return;
    }
    this._visible = visible;
    if (visible && this.server === 'ok') {
      void this._poll.refresh();
    }
  }

  get visible(): boolean {
    return this._visible;
  }

  set refreshInterval(seconds: number) {
    this._poll.frequency = { ...this._poll.frequency, interval: seconds * 1000 };
  }

  /**
   * Check that the server extension is there and at the same version, then start polling.
   */
  async start(): Promise<ServerState> {
    await this.checkServer();
    if (this.server === 'ok') {
      await this.refresh();
      void this._poll.start();
    }
    return this.server;
  }

  async checkServer(): Promise<ServerState> {
    try {
      const status = await this._request<IStatus>('status');
      this.status = status;
      if (status.version !== this.version) {
        this._setServer(
          'mismatch',
          `The SpotWarp server extension is version ${status.version ?? 'unknown'} but this panel is ${this.version}. ` +
            'Install one version of spotwarp (pip install -U spotwarp-jupyter) and restart JupyterLab.'
        );
      } else {
        this._setServer('ok', '');
      }
    } catch (error) {
      if (isMissing(error)) {
        this._setServer(
          'missing',
          'The SpotWarp server extension is not running in this Jupyter server. ' +
            'Run: jupyter server extension enable spotwarp_jupyter, then restart JupyterLab ' +
            '(or start it with: spotwarp start).'
        );
      } else {
        this._setServer('error', `SpotWarp server extension did not answer: ${messageOf(error)}`);
      }
    }
    return this.server;
  }

  /** Fetch status and snapshots. With `rethrow`, failures also reject (the poll backs off). */
  async refresh(rethrow = false): Promise<void> {
    try {
      const [status, list] = await Promise.all([
        this._request<IStatus>('status'),
        this._request<ISnapshotList>('snapshots')
      ]);
      this.status = status;
      this.snapshots = list.snapshots ?? [];
      this.error = null;
      this._changed.emit();
    } catch (error) {
      this.error = messageOf(error);
      if (isMissing(error)) {
        this._setServer('missing', 'The SpotWarp server extension stopped answering (404).');
      }
      this._changed.emit();
      if (rethrow) {
        throw error;
      }
    }
  }

  /** A snapshot of files and every live kernel now; resolves to its id. */
  async snapshotNow(message?: string): Promise<string> {
    return this._act('snapshot', async () => {
      const body = JSON.stringify(message ? { message } : {});
      const answer = await this._request<{ id: string }>('snapshots', { method: 'POST', body });
      return answer.id;
    });
  }

  /** Restore files and the running kernels of a snapshot's notebooks. */
  async restore(id: string): Promise<IRestoreResult> {
    return this._act('restore', () =>
      this._request<IRestoreResult>(`snapshots/${encodeURIComponent(id)}/restore`, {
        method: 'POST'
      })
    );
  }

  /**
   * Run, in a notebook's resumed kernel, the cell that was interrupted outside a resumable loop
   * (`interrupted_cell` of its `resume` entry); resolves to the entry, now running.
   */
  async runInterrupted(notebook: string): Promise<IResumeEntry> {
    return this._act('run', () =>
      this._request<IResumeEntry>('resume/run', { method: 'POST', body: JSON.stringify({ notebook }) })
    );
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    this._poll.dispose();
    Signal.clearData(this);
  }

  private async _act<T>(name: 'snapshot' | 'restore' | 'run', work: () => Promise<T>): Promise<T> {
    if (this.busy) {
      throw new Error(`A ${this.busy} is already in progress.`);
    }
    this.busy = name;
    this._changed.emit();
    try {
      return await work();
    } finally {
      this.busy = '';
      await this.refresh();
    }
  }

  private _setServer(state: ServerState, message: string): void {
    this.server = state;
    this.serverMessage = message;
    this._changed.emit();
  }

  private _request: RequestFn;
  private _poll: Poll;
  private _visible = false;
  private _isDisposed = false;
  private _changed = new Signal<this, void>(this);
}

function isMissing(error: unknown): boolean {
  return error instanceof ApiError && error.status === 404;
}

/** One line for any error the API or the network can raise. */
export function messageOf(error: unknown): string {
  if (error instanceof ServerConnection.NetworkError) {
    return `network error: ${error.message}`;
  }
  if (error instanceof Error) {
    return error.message.split('\n')[0];
  }
  return String(error);
}
