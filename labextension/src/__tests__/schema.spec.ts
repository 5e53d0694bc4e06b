/** The panel's REST types are generated from api/openapi.yaml: regenerating must change nothing. */

import { execFileSync } from 'child_process';
import * as fs from 'fs';
import * as path from 'path';

describe('src/schema.ts', () => {
  it('is what openapi-typescript makes of api/openapi.yaml today (run `jlpm schema` after editing the spec)', () => {
    const root = path.resolve(__dirname, '..', '..');
    const bin = path.join(root, 'node_modules', 'openapi-typescript', 'bin', 'cli.js');
    const fresh = execFileSync(process.execPath, [bin, path.join(root, '..', 'api', 'openapi.yaml')], {
      encoding: 'utf-8',
      stdio: ['ignore', 'pipe', 'ignore']
    });
    const committed = fs.readFileSync(path.join(root, 'src', 'schema.ts'), 'utf-8');
    expect(committed).toBe(fresh);
  });
});
