// Types for format.js (plain JavaScript shared by the status widget and the JupyterLab panel).
// Both accept anything at run time and answer "?" for what is not a finite number.

/** A byte count: "512 B", "1.5 KB", "2.0 GB"; "?" for null, undefined, NaN or ±Infinity. */
export declare function formatSize(n: number | null | undefined): string;

/** A duration in seconds: "420 ms", "12.3 s", "5m 7s", "2h 3m"; "?" for null, undefined, NaN or ±Infinity. */
export declare function formatDuration(s: number | null | undefined): string;
