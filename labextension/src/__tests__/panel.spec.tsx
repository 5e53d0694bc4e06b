import * as React from 'react';
import { act, render, screen, fireEvent } from '@testing-library/react';
import { Widget } from '@lumino/widgets';

import { describeResume, EventsView, ResumeView, ServerNotice, StatusView, Timeline } from '../components';
import { SpotWarpModel } from '../model';
import { SpotWarpActions } from '../actions';
import { SpotWarpPanel } from '../panel';
import { ApiError } from '../request';
import { emptyReport, FakeServer, interrupted, preemption, rerun, snapshot } from './fakeServer';

async function until(cond: () => boolean, what: string, ms = 5000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) {
      throw new Error(`timed out waiting for ${what}`);
    }
    await new Promise(r => setTimeout(r, 10));
  }
}

describe('Timeline', () => {
  const snaps = [
    snapshot({ id: 'bbb', created: '2026-12-02T11:00:00.000Z', host: 'spot-b', variables: ['model', 'opt', 'lr'], files: 4, message: 'after epoch 3' }),
    snapshot({ id: 'aaa', created: '2026-12-02T10:00:00.000Z', host: 'spot-a' })
  ];

  it('shows time, host, size, what changed and contents, newest first', () => {
    render(<Timeline snapshots={snaps} onRestore={() => undefined} />);
    const items = document.querySelectorAll('.jp-SpotWarp-snapshot');
    expect([...items].map(i => i.getAttribute('data-snapshot-id'))).toEqual(['bbb', 'aaa']);
    expect(items[0].textContent).toContain('2026-12-02 11:00:00 UTC');
    expect(items[0].textContent).toContain('spot-b');
    expect(items[0].textContent).toContain('1.5 MB');
    expect(items[0].textContent).toContain('after epoch 3');
    expect(items[0].querySelector('.jp-SpotWarp-change')?.textContent).toBe('+lr · +1 file · wrote 250.0 KB · in 420 ms');
    expect(items[0].querySelector('.jp-SpotWarp-contents')?.textContent).toBe('train.ipynb · 3 variables · 4 files');
    expect(items[1].querySelector('.jp-SpotWarp-change')?.textContent).toMatch(/^first snapshot/);
  });

  it('calls back with the snapshot to restore, and disables buttons while busy', () => {
    const chosen: string[] = [];
    const { rerender } = render(<Timeline snapshots={snaps} onRestore={s => chosen.push(s.id)} />);
    fireEvent.click(screen.getAllByText('Restore')[1]);
    expect(chosen).toEqual(['aaa']);
    rerender(<Timeline snapshots={snaps} busy="restore" onRestore={s => chosen.push(s.id)} />);
    const buttons = screen.getAllByText('Restoring…') as HTMLButtonElement[];
    expect(buttons.every(b => b.disabled)).toBe(true);
  });

  it('limits its length and says how many are hidden', () => {
    render(<Timeline snapshots={snaps} limit={1} onRestore={() => undefined} />);
    expect(document.querySelectorAll('.jp-SpotWarp-snapshot')).toHaveLength(1);
    expect(screen.getByText('1 older snapshots not shown')).toBeTruthy();
  });

  it('says when there is nothing yet', () => {
    render(<Timeline snapshots={[]} onRestore={() => undefined} />);
    expect(screen.getByText('No snapshots in this project yet.')).toBeTruthy();
  });
});

describe('StatusView, EventsView, ServerNotice', () => {
  it('shows storage, watchers and kernels', () => {
    const server = new FakeServer();
    server.snapshots = [snapshot()];
    render(<StatusView status={server.status()} error={null} now={Date.parse('2026-12-02T10:05:00Z')} />);
    expect(screen.getByText('gs://bucket/spotwarp')).toBeTruthy();
    expect(document.querySelector('.jp-SpotWarp-last')?.textContent).toBe('a1b2c3d4 · 5 min ago · 1.5 MB · 420 ms');
    // the project's newest (any notebook, or a files backup) is named apart from each notebook's own, the widget's
    expect(document.querySelector('.jp-SpotWarp-last')?.previousElementSibling?.textContent).toBe(
      "Project's newest snapshot"
    );
    expect(screen.getByText("Kernels: each notebook's last snapshot")).toBeTruthy();
    expect(document.querySelector('.jp-SpotWarp-kernels li')?.textContent).toBe('train.ipynb: a1b2c3d4');
  });

  it("says when the store holds newer state of a kernel's notebook than the kernel", () => {
    const status = new FakeServer().status();
    const newer = { id: 'e5f6a7b8', created: '2026-12-02T10:00:00Z', age_s: 300, variables: 4 };
    status.kernels = [{ ...status.kernels[0], last_snapshot: 'e5f6a7b8', newer }];
    render(<StatusView status={status} error={null} now={Date.parse('2026-12-02T10:05:00Z')} />);
    expect(document.querySelector('.jp-SpotWarp-kernels .jp-SpotWarp-newer')?.textContent).toBe(
      'The store holds newer state of this notebook than this kernel: snapshot e5f6a7b8 (4 variables, 5 min ago), ' +
        'taken before the kernel started and not restored into it. Run %spotwarp restore latest in the notebook ' +
        'to bring it back.'
    );
  });

  it('says a kernel running a cell is busy, not gone', () => {
    const status = new FakeServer().status();
    status.kernels = [{ ...status.kernels[0], last_snapshot: 'a1b2c3d4', execution_state: 'busy' }];
    render(<StatusView status={status} error={null} />);
    expect(document.querySelector('.jp-SpotWarp-kernels li')?.textContent).toBe(
      'train.ipynb: a1b2c3d4 · busy: running a cell (a resumable loop answers at its next step, other cells when they end)'
    );
    // what watches this host first; watchers of other clouds (diagnostics) behind a closed disclosure
    const watchers = [...document.querySelectorAll('.jp-SpotWarp-watcher')];
    expect(watchers.map(w => w.className)).toEqual([
      'jp-SpotWarp-watcher jp-SpotWarp-watcher-watching',
      'jp-SpotWarp-watcher jp-SpotWarp-watcher-watching',
      'jp-SpotWarp-watcher jp-SpotWarp-watcher-off'
    ]);
    expect(watchers[0].textContent).toBe(' sigterm: watching');
    expect(watchers[1].textContent).toBe(' gcp: watching · last notice: preempted, 30.0 s window');
    expect(watchers[2].textContent).toContain('aws: off: not on AWS');
    expect(watchers[2].getAttribute('title')).toBe('endpoint http://169.254.169.254');
    const details = document.querySelector('details.jp-SpotWarp-diagnostics') as HTMLDetailsElement;
    expect(details.open).toBe(false);
    expect(details.contains(watchers[2])).toBe(true);
    expect(details.contains(watchers[0]) || details.contains(watchers[1])).toBe(false);
    expect(details.querySelector('summary')?.textContent).toBe('1 more not watching (another cloud, or off)');
    expect(document.querySelector('.jp-SpotWarp-kernels')?.textContent).toContain('train.ipynb: a1b2c3d4');
    expect(document.querySelector('.jp-SpotWarp-backupError')).toBeNull();
  });

  it('shows why the last automatic backup failed', () => {
    const server = new FakeServer();
    server.lastError = 'storage gs://bucket unreachable';
    render(<StatusView status={server.status()} error={null} />);
    expect(document.querySelector('.jp-SpotWarp-backupError')?.textContent).toBe(
      'Last automatic backup failed: storage gs://bucket unreachable'
    );
  });

  it('says why no kernel was resumed on a host without the key', () => {
    const status = new FakeServer().status();
    const line =
      "project 'demo' is signed, and this host has no key for it: files are restored, no kernel is resumed";
    render(<StatusView status={{ ...status, trust: { key_id: null, line } }} error={null} />);
    expect(document.querySelector('.jp-SpotWarp-trust')?.textContent).toBe(line);
  });

  it('shows no trust notice where the key vouches for the resume', () => {
    const status = new FakeServer().status();
    render(<StatusView status={{ ...status, trust: { key_id: 'abc123', line: null } }} error={null} />);
    expect(document.querySelector('.jp-SpotWarp-trust')).toBeNull();
  });

  it('renders the journal report: preemptions survived, time to resume, each preemption', () => {
    const report = {
      ...emptyReport(),
      preemptions: 2,
      preemptions_survived: 1,
      resume_s_median: 14.2,
      work_lost_s: 3.5,
      compute_saved_s: 5400,
      events: [preemption(), preemption({ host: 'spot-b', source: 'sigterm', survived: false, restored_on: null, resume_s: null, work_lost_s: null, final_snapshot: null })]
    };
    render(<EventsView report={report} />);
    const text = document.querySelector('.jp-SpotWarp-events')?.textContent ?? '';
    expect(text).toContain('Preemptions survived1 of 2');
    expect(text).toContain('Median time to resume14.2 s');
    expect(text).toContain('Compute saved1h 30m');
    const items = [...document.querySelectorAll('.jp-SpotWarp-eventlist li')].map(li => li.textContent);
    expect(items[0]).toMatch(/spot-a lost \(aws\) · final snapshot f1n4l000 · resumed on spot-b in 12\.0 s · work lost 3\.5 s$/);
    expect(items[1]).toMatch(/spot-b lost \(sigterm\) · not resumed yet$/);
  });

  it('counts a loss without notice that a resume found, saying so', () => {
    const lost = preemption({
      time: '2026-12-02T11:00:00.000Z',
      with_notice: false,
      notice: null,
      source: null,
      final_snapshot: null,
      resume_s: 8
    });
    render(<EventsView report={{ ...emptyReport(), preemptions: 1, preemptions_survived: 1, events: [lost] }} />);
    expect(document.body.textContent).not.toContain('No preemptions recorded yet');
    const item = document.querySelector('.jp-SpotWarp-eventlist li')?.textContent ?? '';
    expect(item).toMatch(/spot-a lost without notice \(found when a new host resumed\) · resumed on spot-b in 8\.0 s/);
  });

  it('says when no preemption is recorded, counting non-fatal notices', () => {
    render(<EventsView report={{ ...emptyReport(), warnings: 2 }} />);
    expect(document.body.textContent).toContain('No preemptions recorded yet (2 non-fatal notices).');
  });

  it('shows nothing when all is well and an alert otherwise', () => {
    const { container, rerender } = render(<ServerNotice state="ok" message="" />);
    expect(container.textContent).toBe('');
    rerender(<ServerNotice state="missing" message="The SpotWarp server extension is not running" />);
    expect(screen.getByRole('alert').textContent).toMatch(/not running/);
  });
});

describe('ResumeView', () => {
  const row = {
    time: '2026-12-02T10:31:00.000Z',
    host: 'spot-b',
    notebook: 'train.ipynb',
    snapshot: 'k7m2qx9a',
    cell: 'c3',
    positions: { train: 5 },
    start_to_running_s: 4.2,
    steps_redone: 12,
    steps_redone_how: 'estimated',
    steps_redone_upper_bound: false
  };

  it('says where a re-run notebook resumed from, steps redone and seconds to running again', () => {
    const report = { ...emptyReport(), resumes: [row] };
    expect(describeResume(rerun(), report.resumes)).toBe(
      "train.ipynb: resumed on this host from snapshot k7m2qx9a at step 5 of loop 'train' · about 12 steps redone · running again 4.2 s after start"
    );
    expect(describeResume(rerun(), [{ ...row, steps_redone: null, steps_redone_how: 'unknown: no rate' }])).toContain(
      "loop 'train' · steps redone unknown · running again 4.2 s after start"
    );
    expect(describeResume(rerun(), [{ ...row, steps_redone_upper_bound: true }])).toContain(
      "loop 'train' · at most 12 steps redone · running again"
    );
    expect(describeResume(rerun({ state: 'finished' }), [])).toBe(
      "train.ipynb: resumed on this host from snapshot k7m2qx9a at step 5 of loop 'train' · running again 4.2 s after start · the cell has finished"
    );
    expect(describeResume(rerun({ state: 'failed', line: 'train.ipynb: restored ...; cell c3 re-ran and ended: the kernel died' }))).toMatch(
      /after start · cell c3 re-ran and ended: the kernel died$/
    );
  });

  it("shows a skipped or failed notebook's one-line refusal as the server wrote it", () => {
    const line = "gpu.ipynb: its kernelspec 'py-gpu' is not installed on this host: no kernel started";
    render(<ResumeView resume={[{ notebook: 'gpu.ipynb', state: 'skipped', line }]} onRun={() => undefined} />);
    expect(document.querySelector('[data-notebook="gpu.ipynb"]')?.textContent).toBe(line);
    expect(document.querySelector('.jp-SpotWarp-runCell')).toBeNull();
  });

  it('names the interrupted cell and runs it with one click', () => {
    const asked: string[] = [];
    const { rerender } = render(<ResumeView resume={[rerun(), interrupted()]} onRun={n => asked.push(n)} />);
    const item = document.querySelector('[data-notebook="etl.ipynb"]') as HTMLElement;
    expect(item.querySelector('.jp-SpotWarp-resumeLine')?.textContent).toBe(
      'etl.ipynb: restored on this host from snapshot e1e1e1e1 · cell load was interrupted outside a resumable loop and is not run again by itself'
    );
    expect(document.querySelectorAll('.jp-SpotWarp-runCell')).toHaveLength(1);
    fireEvent.click(screen.getByText('Run cell load'));
    expect(asked).toEqual(['etl.ipynb']);
    rerender(<ResumeView resume={[interrupted()]} busy="run" onRun={n => asked.push(n)} />);
    expect((screen.getByText('Running…') as HTMLButtonElement).disabled).toBe(true);
  });

  it('shows nothing when this host resumed nothing', () => {
    const { container } = render(<ResumeView resume={[]} onRun={() => undefined} />);
    expect(container.textContent).toBe('');
  });
});

describe('SpotWarpPanel', () => {
  it('runs the interrupted cell from the panel, and says why not when the server refuses', async () => {
    const server = new FakeServer();
    server.resume = [rerun(), interrupted(), interrupted({ notebook: 'old.ipynb', kernel_id: 'k3' })];
    const model = new SpotWarpModel({ version: '0.1.0', request: server.request, refreshInterval: 3600 });
    const told: string[] = [];
    const actions = new SpotWarpActions(model, async () => true, (kind, text) => told.push(`${kind}: ${text}`));
    const panel = new SpotWarpPanel({ model, actions });
    Widget.attach(panel, document.body);
    await act(async () => {
      await model.start();
    });
    await until(() => panel.node.querySelectorAll('.jp-SpotWarp-runCell').length === 2, 'two run buttons');
    expect(panel.node.querySelector('[data-notebook="train.ipynb"]')?.textContent).toContain("at step 5 of loop 'train'");
    const button = panel.node.querySelector('[data-notebook="etl.ipynb"] button') as HTMLButtonElement;
    await act(async () => {
      button.click();
      await until(() => told.length === 1, 'the notification');
    });
    expect(server.calls).toContain('POST resume/run');
    expect(told).toEqual(['success: SpotWarp: cell load of etl.ipynb is running again in its resumed kernel.']);
    await until(() => !panel.node.querySelector('[data-notebook="etl.ipynb"] button'), 'the button gone after the run');
    server.failNext = new ApiError(409, 'old.ipynb: its resumed kernel k3 is gone (shut down): nothing run');
    await act(async () => {
      await actions.runInterrupted('old.ipynb');
    });
    expect(told[1]).toBe(
      'error: SpotWarp: the interrupted cell of old.ipynb was not run: old.ipynb: its resumed kernel k3 is gone (shut down): nothing run'
    );
    panel.dispose();
    model.dispose();
  });


  it('renders its sections from the model and restores after confirmation', async () => {
    const server = new FakeServer();
    server.snapshots = [snapshot({ id: 'abc123', host: 'spot-a' })];
    const model = new SpotWarpModel({ version: '0.1.0', request: server.request, refreshInterval: 3600 });
    const confirmed: string[] = [];
    const actions = new SpotWarpActions(model, async title => (confirmed.push(title), true), () => undefined);
    const panel = new SpotWarpPanel({ model, actions });
    Widget.attach(panel, document.body);
    await act(async () => {
      await model.start();
    });
    expect(model.visible).toBe(true);
    await until(() => !!panel.node.querySelector('[data-snapshot-id="abc123"]'), 'the timeline');
    expect(panel.node.textContent).toContain('gs://bucket/spotwarp');
    expect(panel.title.caption).toBe('SpotWarp snapshots');
    const restore = panel.node.querySelector('[data-snapshot-id="abc123"] button') as HTMLButtonElement;
    await act(async () => {
      restore.click();
      await until(() => server.calls.includes('POST snapshots/abc123/restore'), 'the restore call');
    });
    expect(confirmed).toEqual(['Restore snapshot abc123?']);
    panel.hide();
    expect(model.visible).toBe(false);
    panel.dispose();
    model.dispose();
  });

  it('tells the user when the server extension is missing', async () => {
    const server = new FakeServer();
    server.missing = true;
    const model = new SpotWarpModel({ version: '0.1.0', request: server.request });
    const panel = new SpotWarpPanel({ model, actions: new SpotWarpActions(model, async () => true, () => undefined) });
    Widget.attach(panel, document.body);
    await act(async () => {
      await model.start();
    });
    await until(() => !!panel.node.querySelector('[role="alert"]'), 'the alert');
    expect(panel.node.querySelector('[role="alert"]')?.textContent).toMatch(/SpotWarp server extension is not running/);
    panel.dispose();
    model.dispose();
  });
});
