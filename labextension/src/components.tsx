/** The panel's sections as plain React components: props in, markup out (tested with jest). */

import * as React from 'react';

import { ServerState } from './model';
import {
  describeChange,
  describeContents,
  formatAge,
  formatDuration,
  formatSize,
  formatTime,
  previousOf
} from './format';
import { IReport, IReportRow, IResumeEntry, IResumeRow, ISnapshotSummary, IStatus, IWatcherState } from './types';

export function ServerNotice(props: { state: ServerState; message: string }): JSX.Element | null {
  if (props.state === 'ok') {
    return null;
  }
  if (props.state === 'checking') {
    return <div className="jp-SpotWarp-notice">Connecting to the SpotWarp server extension…</div>;
  }
  return (
    <div className="jp-SpotWarp-notice jp-SpotWarp-notice-error" role="alert">
      {props.message}
    </div>
  );
}

export interface IStatusViewProps {
  status: IStatus | null;
  error: string | null;
  now?: number;
}

export function StatusView({ status, error, now }: IStatusViewProps): JSX.Element {
  if (!status) {
    return <div className="jp-SpotWarp-empty">No status yet.</div>;
  }
  const last = status.last_snapshot;
  const watchers = status.watchers ?? [];
  // what watches this host comes first; the other clouds' watchers are diagnostics, behind a disclosure
  const active = watchers.filter(w => stateWord(w.state) === 'watching' || w.last_notice);
  const idle = watchers.filter(w => !active.includes(w));
  const kernels = status.kernels ?? [];
  return (
    <div className="jp-SpotWarp-status">
      {error && <div className="jp-SpotWarp-notice jp-SpotWarp-notice-error">{error}</div>}
      {status.trust?.line && (
        <div className="jp-SpotWarp-notice jp-SpotWarp-notice-error jp-SpotWarp-trust">{status.trust.line}</div>
      )}
      {status.last_error && (
        <div className="jp-SpotWarp-notice jp-SpotWarp-notice-error jp-SpotWarp-backupError">
          Last automatic backup failed: {status.last_error}
        </div>
      )}
      <dl className="jp-SpotWarp-facts">
        <dt>Project</dt>
        <dd>{status.project}</dd>
        <dt>Storage</dt>
        <dd className="jp-SpotWarp-storage" title={status.storage}>
          {status.storage}
        </dd>
        {status.workspace && (
          <>
            <dt>Workspace</dt>
            <dd title={status.workspace}>{status.workspace}</dd>
          </>
        )}
        <dt title="The newest snapshot of the project: of any notebook, or a backup of the files">
          Project&apos;s newest snapshot
        </dt>
        <dd className="jp-SpotWarp-last">
          {last ? (
            <>
              <code>{last.id}</code> · {formatAge(last.created, now)} · {formatSize(last.size)}
              {last.duration_s !== null && last.duration_s !== undefined && ` · ${formatDuration(last.duration_s)}`}
            </>
          ) : (
            'none yet'
          )}
        </dd>
      </dl>
      <h4 className="jp-SpotWarp-subhead">Watchers</h4>
      {active.length ? (
        <ul className="jp-SpotWarp-watchers">{active.map(watcherItem)}</ul>
      ) : (
        <div className="jp-SpotWarp-empty">No preemption watcher is watching this host.</div>
      )}
      {idle.length > 0 && (
        <details className="jp-SpotWarp-diagnostics">
          <summary>{idle.length} more not watching (another cloud, or off)</summary>
          <ul className="jp-SpotWarp-watchers">{idle.map(watcherItem)}</ul>
        </details>
      )}
      <h4 className="jp-SpotWarp-subhead">Kernels: each notebook&apos;s last snapshot</h4>
      {kernels.length ? (
        <ul className="jp-SpotWarp-kernels">
          {kernels.map(k => (
            <li key={k.kernel_id}>
              {k.notebook || k.kernel_id}: {lastOf(k.last_snapshot, now)}
              {k.execution_state === 'busy' &&
                ' · busy: running a cell (a resumable loop answers at its next step, other cells when they end)'}
              {k.newer && (
                <div className="jp-SpotWarp-newer">
                  The store holds newer state of this notebook than this kernel: snapshot {k.newer.id} (
                  {k.newer.variables} variables, {formatAge(k.newer.created, now)}), taken before the kernel started
                  and not restored into it. Run <code>%spotwarp restore latest</code> in the notebook to bring it
                  back.
                </div>
              )}
            </li>
          ))}
        </ul>
      ) : (
        <div className="jp-SpotWarp-empty">No live kernels.</div>
      )}
    </div>
  );
}

function watcherItem(w: IWatcherState): JSX.Element {
  return (
    <li
      key={w.name}
      className={`jp-SpotWarp-watcher jp-SpotWarp-watcher-${stateWord(w.state)}`}
      title={w.endpoint ? `endpoint ${w.endpoint}` : undefined}
    >
      <span className="jp-SpotWarp-dot" /> {w.name}: {w.state}
      {noticeOf(w.last_notice)}
    </li>
  );
}

/** The first word of a watcher's state ("off: not on AWS" -> "off"), for styling. */
export function stateWord(state: unknown): string {
  return String(state ?? '').split(/[:\s]/)[0].toLowerCase().replace(/[^a-z0-9-]/g, '') || 'unknown';
}

function noticeOf(notice: unknown): string {
  if (!notice || typeof notice !== 'object') {
    return '';
  }
  const n = notice as { kind?: string; window_s?: number };
  return ` · last notice: ${n.kind ?? '?'}${n.window_s !== undefined ? `, ${formatDuration(n.window_s)} window` : ''}`;
}

function lastOf(last: ISnapshotSummary | string | null | undefined, now?: number): string {
  if (!last) {
    return 'no snapshot yet';
  }
  if (typeof last === 'string') {
    return last;
  }
  return `${last.id} · ${formatAge(last.created, now)}`;
}

export interface ITimelineProps {
  snapshots: ISnapshotSummary[];
  limit?: number;
  busy?: string;
  disabled?: boolean;
  onRestore: (snapshot: ISnapshotSummary) => void;
}

export function Timeline({ snapshots, limit, busy, disabled, onRestore }: ITimelineProps): JSX.Element {
  if (!snapshots.length) {
    return <div className="jp-SpotWarp-empty">No snapshots in this project yet.</div>;
  }
  const shown = snapshots.slice(0, limit ?? snapshots.length);
  return (
    <ol className="jp-SpotWarp-timeline">
      {shown.map((s, i) => (
        <li key={s.id} className="jp-SpotWarp-snapshot" data-snapshot-id={s.id}>
          <div className="jp-SpotWarp-snapshot-head">
            <span className="jp-SpotWarp-time" title={s.created}>
              {formatTime(s.created)}
            </span>
            <span className="jp-SpotWarp-size">{formatSize(s.size)}</span>
          </div>
          <div className="jp-SpotWarp-host">{s.host}</div>
          <div className="jp-SpotWarp-snapshot-id">
            <code>{s.id}</code>
            {s.kind && <span className="jp-SpotWarp-kind">{s.kind}</span>}
            {s.signed && <span className="jp-SpotWarp-kind">signed</span>}
            {s.message && <span className="jp-SpotWarp-message">{s.message}</span>}
          </div>
          <div className="jp-SpotWarp-change">{describeChange(s, previousOf(snapshots, i))}</div>
          <div className="jp-SpotWarp-contents">{describeContents(s)}</div>
          <button
            className="jp-Button jp-mod-styled jp-mod-reject jp-SpotWarp-restore"
            disabled={disabled || Boolean(busy)}
            onClick={() => onRestore(s)}
          >
            {busy === 'restore' ? 'Restoring…' : 'Restore'}
          </button>
        </li>
      ))}
      {snapshots.length > shown.length && (
        <li className="jp-SpotWarp-more">{snapshots.length - shown.length} older snapshots not shown</li>
      )}
    </ol>
  );
}

/** One preemption of the journal's report, in a line. */
export function describePreemption(e: IReportRow): string {
  const parts = [
    e.with_notice === false
      ? `${formatTime(e.time)}: ${e.host} lost without notice (found when a new host resumed)`
      : `${formatTime(e.notice ?? e.time)}: ${e.host} lost (${e.source ?? 'unknown notice'})`
  ];
  if (e.final_snapshot) {
    parts.push(`final snapshot ${e.final_snapshot}`);
  }
  parts.push(
    e.survived
      ? `resumed on ${e.restored_on ?? 'another host'} in ${formatDuration(e.resume_s)}`
      : 'not resumed yet'
  );
  if (e.work_lost_s !== null) {
    parts.push(`work lost ${formatDuration(e.work_lost_s)}`);
  }
  return parts.join(' · ');
}

/** The `report` of GET status (`spotwarp report`): preemptions survived, time to resume, each preemption. */
export function EventsView({ report }: { report?: IReport | null }): JSX.Element {
  if (!report || report.preemptions === 0) {
    const warnings = report?.warnings ? ` (${report.warnings} non-fatal notices)` : '';
    return <div className="jp-SpotWarp-empty">No preemptions recorded yet{warnings}.</div>;
  }
  return (
    <div className="jp-SpotWarp-events">
      <dl className="jp-SpotWarp-facts">
        <dt>Preemptions survived</dt>
        <dd>
          {report.preemptions_survived} of {report.preemptions}
        </dd>
        <dt>Median time to resume</dt>
        <dd>{formatDuration(report.resume_s_median)}</dd>
        <dt>Work lost</dt>
        <dd>{formatDuration(report.work_lost_s)}</dd>
        <dt>Compute saved</dt>
        <dd>{formatDuration(report.compute_saved_s)}</dd>
      </dl>
      <ol className="jp-SpotWarp-eventlist">
        {report.events.map((e, i) => (
          <li key={i}>{describePreemption(e)}</li>
        ))}
      </ol>
    </div>
  );
}

/** "step 5 of loop 'train'" for each loop the re-run continues after. */
function describePositions(positions: IResumeEntry['positions']): string {
  const names = Object.keys(positions ?? {}).sort();
  return names.map(name => `step ${positions![name]} of loop '${name}'`).join(', ');
}

/** How many steps the lost host had done after the snapshot, as `spotwarp report` knows it. */
function describeRedone(row: IResumeRow | undefined): string | null {
  if (!row) {
    return null;
  }
  if (row.steps_redone === null || row.steps_redone === undefined) {
    return 'steps redone unknown';
  }
  const steps = `${row.steps_redone} step${row.steps_redone === 1 ? '' : 's'} redone`;
  return row.steps_redone_upper_bound ? `at most ${steps}` : `about ${steps}`;
}

/**
 * One notebook's resume on this host, in a line: where its state came from, the step it continued
 * at, steps redone and the seconds to running again; the server's own line for the rest.
 */
export function describeResume(entry: IResumeEntry, rows: IResumeRow[] = []): string {
  if (entry.cell && entry.seconds_to_running !== undefined && entry.seconds_to_running !== null) {
    const at = describePositions(entry.positions);
    const row = rows.find(r => r.notebook === entry.notebook && r.snapshot === entry.snapshot);
    const parts = [
      `${entry.notebook}: resumed on this host from snapshot ${entry.snapshot}${at ? ` at ${at}` : ''}`,
      describeRedone(row),
      `running again ${formatDuration(entry.seconds_to_running)} after start`
    ];
    if (entry.state === 'finished') {
      parts.push('the cell has finished');
    } else if (entry.state === 'failed') {
      parts.push(entry.line.split('; ').pop() ?? entry.line);
    }
    if (entry.warning) {
      parts.push(`WARNING: ${entry.warning}`);
    }
    return parts.filter(Boolean).join(' · ');
  }
  if (entry.interrupted_cell) {
    return (
      `${entry.notebook}: restored on this host from snapshot ${entry.snapshot} · cell ${entry.interrupted_cell} ` +
      'was interrupted outside a resumable loop and is not run again by itself'
    );
  }
  return entry.line;
}

export interface IResumeViewProps {
  resume?: IResumeEntry[] | null;
  report?: IReport | null;
  busy?: string;
  onRun: (notebook: string) => void;
}

/** The `resume` entries of GET status: what resuming each notebook did on this host. */
export function ResumeView({ resume, report, busy, onRun }: IResumeViewProps): JSX.Element | null {
  if (!resume || !resume.length) {
    return null;
  }
  const rows = (report?.resumes ?? []) as IResumeRow[];
  return (
    <div className="jp-SpotWarp-resume">
      <h4 className="jp-SpotWarp-subhead">Resumed on this host</h4>
      <ul className="jp-SpotWarp-resumeList">
        {resume.map(entry => (
          <li
            key={entry.notebook}
            className={`jp-SpotWarp-resumeEntry jp-SpotWarp-resume-${entry.state}`}
            data-notebook={entry.notebook}
          >
            <span className="jp-SpotWarp-resumeLine">{describeResume(entry, rows)}</span>
            {entry.interrupted_cell && entry.state === 'restored' && (
              <button
                className="jp-Button jp-mod-styled jp-mod-accept jp-SpotWarp-runCell"
                title={`Run cell ${entry.interrupted_cell} again, from the source that was running, in this kernel`}
                disabled={Boolean(busy)}
                onClick={() => onRun(entry.notebook)}
              >
                {busy === 'run' ? 'Running…' : `Run cell ${entry.interrupted_cell}`}
              </button>
            )}
          </li>
        ))}
      </ul>
    </div>
  );
}
