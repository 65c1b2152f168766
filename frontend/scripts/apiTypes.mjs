// Writes the API's TypeScript types (default: src/api/schema.d.ts) from its OpenAPI document,
// openapi.json, which `python -m lanner.backend.openapi_document` writes (`./lanner api-types` runs
// both). src/api/schema.test.ts generates them again and fails when the committed file differs.
import { readFileSync, writeFileSync } from 'node:fs'
import openapiTS from 'openapi-typescript'

const document = JSON.parse(readFileSync(new URL('../openapi.json', import.meta.url), 'utf8'))
// A field with a default is always in the API's answers: not optional in the types.
const types = await openapiTS(document, { defaultNonNullable: true })
writeFileSync(process.argv[2] ?? new URL('../src/api/schema.d.ts', import.meta.url), types)
