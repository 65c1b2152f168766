/**
 * The job spec's fields as the API's OpenAPI document describes them (JobCreate and the schemas it
 * refers to): type, bounds, default and choices, read by field path ("hyperparameters.epochs").
 * The New fine-tune form takes them from here, so they are written once, in lanner.core.spec.
 */
import { components } from '../openapi.json'

/** The parts of a JSON Schema (as pydantic writes it) that the form reads. */
export interface JsonSchema {
  $ref?: string
  anyOf?: JsonSchema[]
  type?: string
  enum?: (string | number | boolean)[]
  default?: unknown
  minimum?: number
  maximum?: number
  exclusiveMinimum?: number
  exclusiveMaximum?: number
  properties?: Record<string, JsonSchema>
  /** The learning rate of each method when none is given. */
  'x-default-by-method'?: Record<string, number>
  /** Each preset's hyperparameters. */
  'x-presets'?: Record<string, Record<string, string | number | boolean>>
  'x-method-groups'?: Record<'adapter' | 'preference' | 'whole_model' | 'rl', string[]>
  /** The LoRA targets choices, as target_modules. */
  'x-target-choices'?: Record<string, string[] | 'all-linear'>
}

const SCHEMAS = components.schemas as unknown as Record<string, JsonSchema>

function resolved(schema: JsonSchema): JsonSchema {
  if (!schema.$ref) return schema
  const target = SCHEMAS[schema.$ref.replace('#/components/schemas/', '')]
  if (!target) throw new Error(`the API's OpenAPI document has no ${schema.$ref}`)
  return resolved(target)
}

/** A field of the spec: its own keywords (default, extensions) over its value's schema, and whether it may be null. */
export interface SpecField {
  schema: JsonSchema
  nullable: boolean
}

/** A field of one of the API's request bodies, by its path ("hyperparameters.epochs"); the job spec's by default. */
export function specField(path: string, body: 'JobCreate' | 'ExportCreate' = 'JobCreate'): SpecField {
  let parent = resolved(SCHEMAS[body] ?? {})
  let field: SpecField | null = null
  for (const key of path.split('.')) {
    const property = parent.properties?.[key]
    if (!property) throw new Error(`the API's job spec has no field ${path}`)
    const values = property.anyOf ?? [property]
    const value = values.find((v) => v.type !== 'null')
    if (!value) throw new Error(`the API's job spec field ${path} is always null`)
    const { anyOf: _anyOf, $ref: _ref, ...own } = property
    field = { schema: { ...resolved(value), ...own }, nullable: values.some((v) => v.type === 'null') }
    parent = field.schema
  }
  return field!
}

/** What lanner.core.spec adds to a field's schema (json_schema_extra): each method's learning rate, the presets,
 * the methods that train an adapter, learn from preferences or train every weight, the LoRA targets choices. */
export function specExtension<K extends 'x-default-by-method' | 'x-presets' | 'x-method-groups' | 'x-target-choices'>(path: string, key: K): NonNullable<JsonSchema[K]> {
  const value = specField(path).schema[key]
  if (value == null) throw new Error(`the API's job spec field ${path} has no ${key}`)
  return value
}

/** The choices a property of one of the API's schemas is limited to (its enum). */
export function schemaChoices(schema: string, property: string): string[] {
  const values = resolved(SCHEMAS[schema] ?? {}).properties?.[property]?.enum
  if (!values) throw new Error(`the API's ${schema}.${property} has no choices`)
  return values.map(String)
}
