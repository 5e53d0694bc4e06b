import { ApiError } from '../request';
import { SpotWarpModel } from '../model';
import { SpotWarpActions } from '../actions';
import { describeChange, previousOf } from '../format';
import { FakeServer, snapshot } from './fakeServer';

function setup(server = new FakeServer()) {
  const model = new SpotWarpModel({ version: '0.1.0', request: server.request, refreshInterval: 3600 });
  return { server, model };
}

describe('SpotWarpModel', () => {
  it('checks the server and loads status and snapshots', async () => {
    const { server, model } = setup();
    server.snapshots = [snapshot()];
    expect(await model.start()).toBe('ok');
    expect(model.status?.project).toBe('proj');
    expect(model.snapshots.map(s => s.id)).toEqual(['a1b2c3d4']);
    expect(model.error).toBeNull();
    model.dispose();
  });

  it('says plainly when the server extension is missing', async () => {
    const { server, model } = setup();
    server.missing = true;
    expect(await model.start()).toBe('missing');
    expect(model.serverMessage).toMatch(/not running/);
    expect(model.serverMessage).toMatch(/jupyter server extension enable spotwarp_jupyter/);
    expect(server.calls).toEqual(['GET status']);
    model.dispose();
  });

  it('refuses a server extension of another version', async () => {
    const { server, model } = setup();
    server.version = '0.2.0';
    expect(await model.start()).toBe('mismatch');
    expect(model.serverMessage).toMatch(/version 0\.2\.0 but this panel is 0\.1\.0/);
    expect(server.calls).not.toContain('GET snapshots');
    model.dispose();
  });

  it('keeps the last data and shows the error when a refresh fails', async () => {
    const { server, model } = setup();
    server.snapshots = [snapshot()];
    await model.start();
    server.failNext = new ApiError(500, 'storage gs://bucket unreachable');
    await model.refresh();
    expect(model.error).toBe('storage gs://bucket unreachable');
    expect(model.snapshots).toHaveLength(1);
    await model.refresh();
    expect(model.error).toBeNull();
    model.dispose();
  });

  it('takes a snapshot and refreshes the timeline', async () => {
    const { server, model } = setup();
    await model.start();
    const changes: string[] = [];
    model.changed.connect(() => changes.push(model.busy));
    const id = await model.snapshotNow('before lr change');
    expect(id).toBe('new1');
    expect(server.calls).toContain('POST snapshots');
    expect(model.snapshots[0]).toMatchObject({ id: 'new1', message: 'before lr change' });
    expect(changes[0]).toBe('snapshot');
    expect(model.busy).toBe('');
    model.dispose();
  });

  it('restores by id and reports an unknown id as an error', async () => {
    const { server, model } = setup();
    server.snapshots = [snapshot()];
    await model.start();
    await expect(model.restore('a1b2c3d4')).resolves.toMatchObject({ id: 'a1b2c3d4', files_restored: 3 });
    await expect(model.restore('zz/../x')).rejects.toThrow(/no snapshot 'zz\/..\/x'/);
    expect(server.calls).toContain('POST snapshots/zz%2F..%2Fx/restore');
    expect(model.busy).toBe('');
    model.dispose();
  });

  it('polls only while visible', async () => {
    const { model } = setup();
    await model.start();
    expect(model.visible).toBe(false);
    expect(model.poll.standby).toBeInstanceOf(Function);
    expect((model.poll.standby as () => unknown)()).toBe(true);
    model.visible = true;
    expect((model.poll.standby as () => unknown)()).toBe('when-hidden');
    model.dispose();
    expect(model.poll.isDisposed).toBe(true);
  });
});

describe('SpotWarpActions', () => {
  it('asks before restoring and does nothing when cancelled', async () => {
    const { server, model } = setup();
    server.snapshots = [snapshot()];
    await model.start();
    const asked: string[] = [];
    const notes: string[] = [];
    let answer = false;
    const actions = new SpotWarpActions(
      model,
      async title => {
        asked.push(title);
        return answer;
      },
      (kind, text) => notes.push(`${kind}: ${text}`)
    );
    expect(await actions.restoreLatest()).toBe(false);
    expect(asked).toEqual(['Restore snapshot a1b2c3d4?']);
    expect(server.calls.filter(c => c.startsWith('POST'))).toEqual([]);
    answer = true;
    expect(await actions.restoreLatest()).toBe(true);
    expect(notes).toEqual(['success: Restored a1b2c3d4: 3 files, 1 kernel in 1.3 s.']);
    server.kernelError = 'SpotWarp is not loaded in this kernel';
    expect(await actions.restoreLatest()).toBe(true);
    expect(notes[1]).toBe(
      'error: Restored a1b2c3d4: 3 files, 0 kernels in 1.3 s. Not restored: train.ipynb: SpotWarp is not loaded in this kernel'
    );
    model.dispose();
  });

  it('notifies a failed snapshot in one line', async () => {
    const { server, model } = setup();
    await model.start();
    const notes: string[] = [];
    const actions = new SpotWarpActions(model, async () => true, (kind, text) => notes.push(`${kind}: ${text}`));
    server.failNext = new ApiError(503, 'storage unreachable: gs://bucket');
    expect(await actions.snapshotNow()).toBeNull();
    expect(notes).toEqual(['error: SpotWarp snapshot failed: storage unreachable: gs://bucket']);
    expect(await actions.snapshotNow()).toBe('new1');
    model.dispose();
  });

  it('says so when there is nothing to restore', async () => {
    const { model } = setup();
    await model.start();
    const notes: string[] = [];
    const actions = new SpotWarpActions(model, async () => true, (kind, text) => notes.push(`${kind}: ${text}`));
    expect(await actions.restoreLatest()).toBe(false);
    expect(notes[0]).toMatch(/no snapshot to restore/);
    model.dispose();
  });
});

describe('describeChange', () => {
  it('names added and removed variables and file changes', () => {
    const older = snapshot({ variables: ['a', 'b'], files: 2 });
    const newer = snapshot({ variables: ['b', 'c'], files: 5, bytes_written: 2_000_000, duration_s: 1.5 });
    expect(describeChange(newer, older)).toBe('+c · −a · +3 files · wrote 2.0 MB · in 1.5 s');
    expect(describeChange(older)).toMatch(/^first snapshot · wrote/);
  });
});

describe('previousOf', () => {
  it('compares a snapshot with the older one of its kind and notebook', () => {
    const list = [
      snapshot({ id: 'k2', kind: 'kernel', notebooks: ['a.ipynb'] }),
      snapshot({ id: 'f1', kind: 'project', notebooks: [] }),
      snapshot({ id: 'kb', kind: 'kernel', notebooks: ['b.ipynb'] }),
      snapshot({ id: 'k1', kind: 'kernel', notebooks: ['a.ipynb'] })
    ];
    expect(previousOf(list, 0)?.id).toBe('k1');
    expect(previousOf(list, 1)).toBeUndefined();
    expect(previousOf(list, 3)).toBeUndefined();
  });
});
