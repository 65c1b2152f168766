// @vitest-environment node
import { execFileSync } from 'node:child_process'
import { mkdtempSync, readFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { expect, it } from 'vitest'

it('the committed API types are generated from the committed OpenAPI document', () => {
  const fresh = join(mkdtempSync(join(tmpdir(), 'lanner-api-')), 'schema.d.ts')
  execFileSync(process.execPath, ['scripts/apiTypes.mjs', fresh])
  const same = readFileSync(fresh, 'utf8') === readFileSync('src/api/schema.d.ts', 'utf8')
  expect(same, 'the API changed: run `./lanner api-types` and commit frontend/openapi.json and frontend/src/api/schema.d.ts').toBe(true)
})
