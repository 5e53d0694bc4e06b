// Sizes and durations as people read them: the one copy used by both front-ends.
//
// - The status widget: status.py serves this file followed by widget.js as the widget's single ES
//   module (anywidget loads one module from a string, so no imports here or there).
// - The JupyterLab panel: labextension/src/format.ts re-exports these, and webpack bundles this file.
//   Types for it are in format.d.ts next to it.
//
// Plain ES2018, no imports, no dependencies. Odd input (agreed once, for both, tested in
// labextension/src/__tests__/format.spec.ts):
//
//   input                              formatSize      formatDuration
//   null, undefined, NaN, ±Infinity,   "?"             "?"
//   or not a number at all
//   0 (and -0)                         "0 B"           "0 ms"
//   negative                           "-1.5 KB"       "-2.0 s"   (the sign, then the magnitude;
//                                                      a value that rounds to zero has no sign)
//   very large                         stays in TB     stays in hours
//                                      ("1500.0 TB")   ("2777h 46m")
//
// A value that rounds up to the next unit is shown in that unit: 999.96 KB is "1.0 MB" (not
// "1000.0 KB"), 0.9996 s is "1.0 s" (not "1000 ms"), 119.6 s is "2m 0s" (not "1m 60s").

const SIZE_UNITS = ["B", "KB", "MB", "GB", "TB"];

function isNumber(x) {
  return typeof x === "number" && Number.isFinite(x);
}

function signed(negative, text, zero) {
  return negative && text !== zero ? `-${text}` : text;
}

/** A byte count: "512 B", "1.5 KB", "2.0 GB" (decimal units, as the Python side's format_size). */
export function formatSize(n) {
  if (!isNumber(n)) return "?";
  let v = Math.abs(n);
  let i = 0;
  while (i < SIZE_UNITS.length - 1 && Number(v.toFixed(i === 0 ? 0 : 1)) >= 1000) {
    v /= 1000;
    i += 1;
  }
  const text = `${v.toFixed(i === 0 ? 0 : 1)} ${SIZE_UNITS[i]}`;
  return signed(n < 0, text, "0 B");
}

/** A duration in seconds: "420 ms", "12.3 s", "5m 7s", "2h 3m". */
export function formatDuration(s) {
  if (!isNumber(s)) return "?";
  const v = Math.abs(s);
  let text;
  const ms = Math.round(v * 1000);
  const tenths = Math.round(v * 10);
  const whole = Math.round(v);
  if (ms < 1000) text = `${ms} ms`;
  else if (tenths < 600) text = `${(tenths / 10).toFixed(1)} s`;
  else if (whole < 3600) text = `${Math.floor(whole / 60)}m ${whole % 60}s`;
  else text = `${Math.floor(whole / 3600)}h ${Math.floor((whole % 3600) / 60)}m`;
  return signed(s < 0, text, "0 ms");
}
