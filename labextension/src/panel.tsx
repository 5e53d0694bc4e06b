import * as React from 'react';
import { ReactWidget, ToolbarButton, UseSignal } from '@jupyterlab/apputils';
import { refreshIcon, SidePanel } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import { AccordionPanel } from '@lumino/widgets';

import { SpotWarpActions } from './actions';
import { EventsView, ResumeView, ServerNotice, StatusView, Timeline } from './components';
import { spotwarpIcon } from './icon';
import { SpotWarpModel } from './model';

/** A ReactWidget section that re-renders whenever the model changes. */
class Section extends ReactWidget {
  constructor(
    private _model: SpotWarpModel,
    private _body: () => JSX.Element | null,
    label: string,
    className: string
  ) {
    super();
    this.title.label = label;
    this.addClass('jp-SpotWarp-section');
    this.addClass(className);
  }

  render(): JSX.Element {
    return <UseSignal signal={this._model.changed}>{() => this._body()}</UseSignal>;
  }
}

export interface ISpotWarpPanelOptions {
  model: SpotWarpModel;
  actions: SpotWarpActions;
  /** How many snapshots the timeline shows. */
  timelineLength?: number;
}

/**
 * The SpotWarp side panel: server check, status (storage, watchers, kernels), the snapshots
 * timeline with restore buttons, and the preemption events of `spotwarp report`.
 */
export class SpotWarpPanel extends SidePanel {
  constructor(options: ISpotWarpPanelOptions) {
    super();
    const { model, actions } = options;
    this.model = model;
    this.timelineLength = options.timelineLength ?? 50;
    this.id = 'spotwarp-panel';
    this.addClass('jp-SpotWarp-panel');
    this.title.icon = spotwarpIcon;
    this.title.caption = 'SpotWarp snapshots';

    const header = ReactWidget.create(
      <UseSignal signal={model.changed}>
        {() => (
          <div className="jp-SpotWarp-header">
            <h2>SpotWarp</h2>
            <ServerNotice state={model.server} message={model.serverMessage} />
          </div>
        )}
      </UseSignal>
    );
    header.addClass('jp-SpotWarp-headerWidget');
    this.header.addWidget(header);

    this.toolbar.addItem(
      'snapshot',
      new ToolbarButton({
        icon: spotwarpIcon,
        label: 'Snapshot now',
        tooltip: 'Take a snapshot of files and all running kernels now',
        className: 'jp-SpotWarp-snapshotNow',
        onClick: () => void actions.snapshotNow()
      })
    );
    this.toolbar.addItem(
      'refresh',
      new ToolbarButton({
        icon: refreshIcon,
        tooltip: 'Refresh',
        onClick: () => void model.refresh()
      })
    );

    this.addWidget(
      new Section(
        model,
        () => (
          <>
            <ResumeView
              resume={model.status?.resume}
              report={model.status?.report}
              busy={model.busy}
              onRun={notebook => void actions.runInterrupted(notebook)}
            />
            <StatusView status={model.status} error={model.error} />
          </>
        ),
        'Status',
        'jp-SpotWarp-statusSection'
      )
    );
    this.addWidget(
      new Section(
        model,
        () => (
          <Timeline
            snapshots={model.snapshots}
            limit={this.timelineLength}
            busy={model.busy}
            disabled={model.server !== 'ok'}
            onRestore={s => void actions.restore(s)}
          />
        ),
        'Snapshots',
        'jp-SpotWarp-timelineSection'
      )
    );
    this.addWidget(
      new Section(model, () => <EventsView report={model.status?.report} />, 'Preemptions', 'jp-SpotWarp-eventsSection')
    );
  }

  readonly model: SpotWarpModel;
  timelineLength: number;

  private _sized = false;

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this.model.visible = this.isVisible;
  }

  protected onBeforeDetach(msg: Message): void {
    this.model.visible = false;
    super.onBeforeDetach(msg);
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.model.visible = true;
    if (!this._sized && this.content instanceof AccordionPanel) {
      // the timeline is what people come for: give it most of the height the first time
      this.content.setRelativeSizes([3, 4, 1]);
      this._sized = true;
    }
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this.model.visible = false;
  }
}
