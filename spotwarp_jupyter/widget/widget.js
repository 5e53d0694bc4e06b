// SpotWarp status widget (anywidget). Hand-written ES module: no bundler, no imports.
// status.py serves format.js followed by this file as one module, so formatSize and formatDuration
// (shared with the JupyterLab panel) are defined there, not here.
// The kernel owns the state (`status`, `newer`, `busy`, `notice`); buttons send custom messages
// (spotwarp_jupyter/protocol.py WidgetAction), each with a request id the kernel echoes in `answered`.

function formatAge(iso, now = Date.now()) {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return "";
  const s = Math.max(0, (now - t) / 1000);
  if (s < 60) return `${Math.floor(s)} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min ago`;
  return `${Math.floor(s / 86400)} days ago`;
}

function formatTime(iso) {
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

// What an offer brings back: "3 variables of train.ipynb", then its size, training position and age.
function offerWhat(offer) {
  const n = offer.variables;
  return `${n} variable${n === 1 ? "" : "s"} of ${offer.notebook}`;
}

function offerDetails(offer) {
  const parts = [formatSize(offer.state_size)];
  for (const [loop, step] of Object.entries(offer.positions || {}).sort()) parts.push(`${loop} at step ${step}`);
  parts.push(`saved ${formatAge(offer.created)}`, `snapshot ${offer.id}`);
  return parts.join(" · ");
}

function node(tag, className, text) {
  const el = document.createElement(tag);
  if (className) el.className = className;
  if (text !== undefined) el.textContent = text;
  return el;
}

function row(label, value, className) {
  const r = node("div", "spotwarp-w-row" + (className ? ` ${className}` : ""));
  r.append(node("span", "spotwarp-w-label", label));
  if (typeof value === "string") r.append(node("span", "spotwarp-w-value", value));
  else r.append(value);
  return r;
}

const REFRESH_MS = 15000; // ask the kernel now and then (a newer snapshot from another host; is it still there)
const SILENT_MS = 10000; // a refresh unanswered this long: the kernel or its server is gone
// The widget's snapshot is this kernel's; the SpotWarp panel's "Project's newest snapshot" may be another
// notebook's, or a files backup.
const LAST_LABEL = "This notebook's last snapshot";

// Why the widget can no longer vouch for the session: a refresh unanswered for SILENT_MS (the browser lost
// its server, the kernel died), or "" while answers come.
function silence(askedAt, now) {
  if (askedAt === null || now - askedAt < SILENT_MS) return "";
  return `no answer from the kernel for ${Math.round((now - askedAt) / 1000)} s: its server may be gone`;
}

// The state next to the dot: [protected, words]. A cell running keeps the kernel's main thread from answering a
// refresh; its watcher thread says `cell_running` meanwhile (`busyHeard`: when the browser last heard it), so a busy
// kernel reads "busy, protected <age of this notebook's last snapshot>", never silence.
function headline(s, silent, busyHeard, now) {
  if (!s.protected || silent) return [false, `not protected: ${silent || s.protection || "?"}`];
  if (busyHeard === null || now - busyHeard >= SILENT_MS) return [true, "protected"];
  const last = s.last_snapshot;
  return [true, last ? `busy, protected ${formatAge(last.created, now)}` : "busy, protected"];
}

let requests = 0;

function requestId() {
  requests += 1;
  return `w${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}-${requests}`;
}

function render({ model, el }) {
  const ask = (content) => {
    const id = requestId();
    try {
      model.send({ ...content, request_id: id });
    } catch (err) {
      // a closed connection: the silence check below says so
    }
    return id;
  };
  let askedAt = null; // when the oldest unanswered refresh was sent
  let busyHeard = null; // when the kernel last said a cell runs (model `cell_running`), null between cells
  let silent = "";
  const root = node("div", "spotwarp-widget");
  el.append(root);
  let ageEl = null;
  let stateEl = null;
  let dotEl = null;

  function drawState() {
    const [ok, words] = headline(model.get("status") || {}, silent, busyHeard, Date.now());
    root.dataset.protected = ok ? "yes" : "no";
    if (dotEl) dotEl.className = "spotwarp-w-dot " + (ok ? "is-ok" : "is-warn");
    if (stateEl) stateEl.textContent = words;
  }

  function draw() {
    const s = model.get("status") || {};
    const newer = model.get("newer");
    const busy = model.get("busy");
    const last = s.last_snapshot;
    root.replaceChildren();

    const head = node("div", "spotwarp-w-head");
    dotEl = node("span", "spotwarp-w-dot");
    head.append(dotEl);
    head.append(node("span", "spotwarp-w-title", "SpotWarp"));
    stateEl = node("span", "spotwarp-w-state");
    head.append(stateEl);
    drawState();
    head.append(node("span", "spotwarp-w-where", `${s.project || "?"} · ${s.notebook || "?"}`));
    root.append(head);

    if (last) {
      const v = node("span", "spotwarp-w-value");
      v.append(node("code", "spotwarp-w-id", last.id));
      ageEl = node("span", "spotwarp-w-age", ` · ${formatAge(last.created)}`);
      v.append(ageEl);
      v.append(document.createTextNode(
        ` · ${formatSize(last.size)} · wrote ${formatSize(last.bytes_written)} in ${formatDuration(last.duration_s)}`
      ));
      root.append(row(LAST_LABEL, v, "spotwarp-w-last"));
    } else {
      ageEl = null;
      root.append(row(LAST_LABEL, "none from this kernel yet", "spotwarp-w-last"));
    }
    root.append(row("Policy", s.policy_text || "", "spotwarp-w-policy"));
    if (s.cadence && s.cadence.text) root.append(row("Cadence", s.cadence.text, "spotwarp-w-cadence"));
    root.append(row("Storage", s.storage || "", "spotwarp-w-storage"));
    if (s.last_error) root.append(row("Error", s.last_error, "spotwarp-w-error"));

    const skipped = Object.entries(s.skipped || {});
    if (skipped.length) {
      const list = node("ul", "spotwarp-w-skipped");
      for (const [name, reason] of skipped.sort()) {
        const li = node("li");
        li.append(node("code", "", name), document.createTextNode(`: ${reason}`));
        list.append(li);
      }
      root.append(row("Skipped", list, "spotwarp-w-skip"));
    }

    const actions = node("div", "spotwarp-w-actions");
    const snap = node("button", "spotwarp-w-button spotwarp-w-snapshot", busy === "snapshot" ? "Taking snapshot…" : "Snapshot now");
    snap.disabled = Boolean(busy);
    snap.addEventListener("click", () => ask({ action: "snapshot" }));
    actions.append(snap);
    if (newer) {
      const label = busy === "restore" ? "Restoring…" : `Restore ${offerWhat(newer)} from ${newer.host}`;
      const restore = node("button", "spotwarp-w-button spotwarp-w-restore", label);
      restore.title = `Snapshot ${newer.id}, ${formatTime(newer.created)}${newer.message ? ": " + newer.message : ""}`;
      restore.disabled = Boolean(busy);
      restore.addEventListener("click", () => ask({ action: "restore", id: newer.id }));
      actions.append(restore);
    }
    root.append(actions);
    if (newer) root.append(node("div", "spotwarp-w-offer", offerDetails(newer)));

    const notice = model.get("notice");
    if (notice) root.append(node("div", `spotwarp-w-notice is-${model.get("notice_kind") || "ok"}`, notice));
  }

  function tick() {
    const last = (model.get("status") || {}).last_snapshot;
    if (ageEl && last) ageEl.textContent = ` · ${formatAge(last.created)}`;
    const now = silence(askedAt, Date.now());
    if (now !== silent) {
      silent = now;
      draw();
    } else {
      drawState(); // the busy line's age, and its end when the kernel stops saying a cell runs
    }
  }

  draw();
  for (const name of ["status", "newer", "busy", "notice", "notice_kind"]) model.on(`change:${name}`, draw);
  model.on("change:cell_running", () => {
    askedAt = null; // the kernel's watcher thread speaks: it is there, running a cell (0: between cells)
    busyHeard = model.get("cell_running") ? Date.now() : null;
    if (silent) {
      silent = "";
      draw();
    } else {
      drawState();
    }
  });
  model.on("change:answered", () => {
    askedAt = null; // the kernel answers: it is there
    if (silent) {
      silent = "";
      draw();
    }
  });
  const ticker = setInterval(tick, 1000);
  // Ask the kernel now and then whether another host has written a newer snapshot; its answers also
  // show it is still there.
  const poller = setInterval(() => {
    if (document.hidden) return;
    if (askedAt === null) askedAt = Date.now();
    ask({ action: "refresh" });
  }, REFRESH_MS);
  return () => {
    clearInterval(ticker);
    clearInterval(poller);
  };
}

export { offerWhat, offerDetails, silence, headline, LAST_LABEL };
export default { render };
