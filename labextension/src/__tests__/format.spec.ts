/**
 * formatSize and formatDuration: one copy (spotwarp_jupyter/widget/format.js) for the panel and the
 * notebook's status widget, with one agreed behaviour for odd input.
 */

import { formatDuration, formatSize } from '../format';
import * as shared from '../../../spotwarp_jupyter/widget/format.js';

// What the widget gets from the kernel is JSON of any shape; TypeScript callers may still pass these.
const notANumber = ['12', '', true, false, {}, [], [1], BigInt(10)] as unknown as number[];

describe('one source', () => {
  it('the panel uses the functions of the file the widget is served from', () => {
    expect(formatSize).toBe(shared.formatSize);
    expect(formatDuration).toBe(shared.formatDuration);
  });
});

describe('formatSize', () => {
  it('formats ordinary sizes in decimal units', () => {
    expect(formatSize(1)).toBe('1 B');
    expect(formatSize(512)).toBe('512 B');
    expect(formatSize(999)).toBe('999 B');
    expect(formatSize(1000)).toBe('1.0 KB');
    expect(formatSize(1500)).toBe('1.5 KB');
    expect(formatSize(250_000)).toBe('250.0 KB');
    expect(formatSize(1_500_000)).toBe('1.5 MB');
    expect(formatSize(2_000_000_000)).toBe('2.0 GB');
    expect(formatSize(3.25e12)).toBe('3.3 TB');
  });

  it('shows zero as 0 B, without a sign for -0', () => {
    expect(formatSize(0)).toBe('0 B');
    expect(formatSize(-0)).toBe('0 B');
  });

  it('answers ? for null, undefined, NaN, infinities and non-numbers', () => {
    for (const odd of [null, undefined, NaN, Infinity, -Infinity, ...notANumber]) {
      expect(formatSize(odd)).toBe('?');
    }
  });

  it('keeps the sign of a negative size and formats its magnitude', () => {
    expect(formatSize(-1)).toBe('-1 B');
    expect(formatSize(-1500)).toBe('-1.5 KB');
    expect(formatSize(-2_000_000)).toBe('-2.0 MB');
    expect(formatSize(-0.4)).toBe('0 B'); // rounds to zero: no sign
  });

  it('rounds fractional bytes', () => {
    expect(formatSize(0.4)).toBe('0 B');
    expect(formatSize(2.6)).toBe('3 B');
  });

  it('moves to the next unit when rounding reaches 1000', () => {
    expect(formatSize(999.4)).toBe('999 B');
    expect(formatSize(999.5)).toBe('1.0 KB');
    expect(formatSize(999_940)).toBe('999.9 KB');
    expect(formatSize(999_960)).toBe('1.0 MB');
    expect(formatSize(-999_960)).toBe('-1.0 MB');
    expect(formatSize(999_960_000_000)).toBe('1.0 TB');
  });

  it('stays in TB for very large sizes', () => {
    expect(formatSize(1.5e15)).toBe('1500.0 TB');
    expect(formatSize(Number.MAX_SAFE_INTEGER)).toBe('9007.2 TB');
    expect(formatSize(1e18)).toBe('1000000.0 TB');
  });
});

describe('formatDuration', () => {
  it('formats ordinary durations', () => {
    expect(formatDuration(0.001)).toBe('1 ms');
    expect(formatDuration(0.42)).toBe('420 ms');
    expect(formatDuration(1)).toBe('1.0 s');
    expect(formatDuration(1.5)).toBe('1.5 s');
    expect(formatDuration(12.34)).toBe('12.3 s');
    expect(formatDuration(60)).toBe('1m 0s');
    expect(formatDuration(307)).toBe('5m 7s');
    expect(formatDuration(3600)).toBe('1h 0m');
    expect(formatDuration(7380)).toBe('2h 3m');
  });

  it('shows zero as 0 ms, without a sign for -0', () => {
    expect(formatDuration(0)).toBe('0 ms');
    expect(formatDuration(-0)).toBe('0 ms');
    expect(formatDuration(0.0004)).toBe('0 ms');
  });

  it('answers ? for null, undefined, NaN, infinities and non-numbers', () => {
    for (const odd of [null, undefined, NaN, Infinity, -Infinity, ...notANumber]) {
      expect(formatDuration(odd)).toBe('?');
    }
  });

  it('keeps the sign of a negative duration (clock skew) and formats its magnitude', () => {
    expect(formatDuration(-0.25)).toBe('-250 ms');
    expect(formatDuration(-2)).toBe('-2.0 s');
    expect(formatDuration(-307)).toBe('-5m 7s');
    expect(formatDuration(-7380)).toBe('-2h 3m');
    expect(formatDuration(-0.0004)).toBe('0 ms'); // rounds to zero: no sign
  });

  it('moves to the next unit when rounding reaches its end, never "1000 ms" or "1m 60s"', () => {
    expect(formatDuration(0.9994)).toBe('999 ms');
    expect(formatDuration(0.9996)).toBe('1.0 s');
    expect(formatDuration(59.94)).toBe('59.9 s');
    expect(formatDuration(59.96)).toBe('1m 0s');
    expect(formatDuration(119.6)).toBe('2m 0s');
    expect(formatDuration(3599.4)).toBe('59m 59s');
    expect(formatDuration(3599.6)).toBe('1h 0m');
    expect(formatDuration(-3599.6)).toBe('-1h 0m');
  });

  it('stays in hours for very long durations', () => {
    expect(formatDuration(86_400)).toBe('24h 0m');
    expect(formatDuration(10_000_000)).toBe('2777h 46m');
  });
});
