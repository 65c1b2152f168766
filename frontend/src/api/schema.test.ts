// @vitest-environment node
import { execFileSync } from 'node:child_process'
import { mkdtempSync, readFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { expect, it } from 'vitest'

it('the committed API types are generated from the committed OpenAPI document', () => {
  const fresh = join(mkdtempSync(join(tmpdir(), 'lanner-api-')), 'schema.d.ts')
  execFileSync(process.execPath, [fileURLToPath(new URL('../../scripts/apiTypes.mjs', import.meta.url)), fresh])
  const same = readFileSync(fresh, 'utf8') === readFileSync(new URL('./schema.d.ts', import.meta.url), 'utf8')
  expect(same, 'the API changed: run `./lanner api-types` and commit frontend/openapi.json and frontend/src/api/schema.d.ts').toBe(true)
})
