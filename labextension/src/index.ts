import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, Notification } from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';

import { SpotWarpActions } from './actions';
import { spotwarpIcon } from './icon';
import { SpotWarpModel } from './model';
import { SpotWarpPanel } from './panel';

// The bundler inlines package.json, so the version checked against the server is the one built.
declare function require(path: string): any;
const VERSION: string = require('../package.json').version;
const PLUGIN_ID = 'spotwarp:plugin';

export namespace CommandIDs {
  export const snapshot = 'spotwarp:snapshot';
  export const restoreLatest = 'spotwarp:restore-latest';
  export const open = 'spotwarp:open';
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'SpotWarp side panel: snapshots timeline, watchers, storage, restore and snapshot-now.',
  autoStart: true,
  optional: [ILayoutRestorer, ISettingRegistry, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    restorer: ILayoutRestorer | null,
    settingRegistry: ISettingRegistry | null,
    palette: ICommandPalette | null
  ) => {
    const model = new SpotWarpModel({ version: VERSION });
    const actions = new SpotWarpActions(model);
    const panel = new SpotWarpPanel({ model, actions });
    app.shell.add(panel, 'left', { rank: 850 });
    restorer?.add(panel, 'spotwarp-panel');

    app.commands.addCommand(CommandIDs.snapshot, {
      label: 'SpotWarp: Take a Snapshot',
      caption: 'Snapshot workspace files and every running kernel now',
      icon: spotwarpIcon,
      execute: () => actions.snapshotNow()
    });
    app.commands.addCommand(CommandIDs.restoreLatest, {
      label: 'SpotWarp: Restore Latest Snapshot',
      caption: 'Restore the newest snapshot of this project',
      execute: () => actions.restoreLatest()
    });
    app.commands.addCommand(CommandIDs.open, {
      label: 'SpotWarp: Open Panel',
      caption: 'Show the SpotWarp side panel',
      icon: spotwarpIcon,
      execute: () => app.shell.activateById(panel.id)
    });
    if (palette) {
      for (const command of [CommandIDs.snapshot, CommandIDs.restoreLatest, CommandIDs.open]) {
        palette.addItem({ command, category: 'SpotWarp' });
      }
    }

    const apply = (settings: ISettingRegistry.ISettings): void => {
      model.refreshInterval = settings.get('refreshInterval').composite as number;
      panel.timelineLength = settings.get('timelineLength').composite as number;
      if (model.server === 'ok') {
        void model.refresh();
      }
    };
    if (settingRegistry) {
      settingRegistry
        .load(PLUGIN_ID)
        .then(settings => {
          apply(settings);
          settings.changed.connect(apply);
        })
        .catch(reason => console.error('SpotWarp: could not load settings.', reason));
    }

    void model.start().then(state => {
      if (state !== 'ok') {
        // said once where the user looks, and at the top of the panel for as long as it lasts
        console.warn(`SpotWarp: ${model.serverMessage}`);
        Notification.warning(model.serverMessage, { autoClose: false });
      }
    });
  }
};

export default plugin;
