/**
 * The sweep part of the New fine-tune form as plain data: which fields to sweep, with values or a
 * range each, the strategy, the budget and the metric; and the body of POST /api/sweeps, whose
 * `base` is the job the rest of the form describes. The fields a sweep may vary come from the API's
 * OpenAPI document (lanner.core.sweep.SWEPT_FIELDS).
 */
import { FIELDS } from './jobForm'
import { schemaChoices } from './specSchema'
import type { SweepCreate } from './types'

export const SWEPT_FIELDS = schemaChoices('SweepParameter', 'field')

export interface SweptRow {
  field: string
  mode: 'values' | 'range'
  /** Comma-separated: numbers, or names (a scheduler). */
  values: string
  low: string
  high: string
  log: boolean
}

export interface SweepForm {
  enabled: boolean
  strategy: 'grid' | 'random'
  rows: SweptRow[]
  budget: string
  seed: string
  metric: string
  direction: 'minimize' | 'maximize'
}

export function newSweepForm(): SweepForm {
  return {
    enabled: false, strategy: 'grid', budget: '4', seed: '0', metric: 'loss', direction: 'minimize',
    rows: [{ field: 'hyperparameters.learning_rate', mode: 'values', values: '1e-4, 2e-4', low: '', high: '', log: true }],
  }
}

export function newRow(taken: string[]): SweptRow {
  const field = SWEPT_FIELDS.find((f) => !taken.includes(f)) ?? SWEPT_FIELDS[0]!
  return { field, mode: 'values', values: '', low: '', high: '', log: false }
}

/** The form's label of a swept field ("Learning rate"), or its path. */
export function fieldLabel(path: string): string {
  return FIELDS.find((f) => f.path === path)?.label ?? path
}

function parseValues(text: string): (number | string)[] {
  return text.split(',').map((part) => part.trim()).filter(Boolean).map((part) => {
    const value = Number(part)
    return Number.isFinite(value) ? value : part
  })
}

/** The problems the form can tell by itself, by the server's field path ("parameters.0.values", "budget"). */
export function validateSweepForm(form: SweepForm): Record<string, string> {
  const errors: Record<string, string> = {}
  form.rows.forEach((row, i) => {
    if (row.mode === 'values' && parseValues(row.values).length === 0) errors[`parameters.${i}.values`] = 'Give one value or more, separated by commas.'
    if (row.mode === 'range' && !(Number(row.low) < Number(row.high))) errors[`parameters.${i}.values`] = 'Give a range: low below high.'
  })
  const budget = Number(form.budget)
  if (!Number.isInteger(budget) || budget < 1) errors.budget = 'A whole number of runs, 1 or more.'
  if (!Number.isInteger(Number(form.seed)) || Number(form.seed) < 0) errors.seed = 'A whole number, 0 or more.'
  if (!form.metric.trim()) errors.metric = 'Name the metric that ranks the runs.'
  return errors
}

/** How many runs the sweep will queue: the grid's size, or the budget. */
export function plannedRuns(form: SweepForm): number {
  if (form.strategy === 'random') return Number(form.budget) || 0
  return form.rows.reduce((product, row) => product * parseValues(row.values).length, 1)
}

/** The body of POST /api/sweeps. Assumes validateSweepForm found nothing. */
export function buildSweep(form: SweepForm, base: Record<string, unknown>, name: string): SweepCreate {
  return {
    base: base as SweepCreate['base'],
    name: name.trim() || null,
    strategy: form.strategy,
    budget: Number(form.budget),
    seed: Number(form.seed),
    metric: form.metric.trim(),
    direction: form.direction,
    parameters: form.rows.map((row) => (row.mode === 'values'
      ? { field: row.field as SweepCreate['parameters'][number]['field'], values: parseValues(row.values), log: false }
      : { field: row.field as SweepCreate['parameters'][number]['field'], low: Number(row.low), high: Number(row.high), log: row.log })),
  }
}

/**
 * A 422 of POST /api/sweeps split in two: the base spec's issues by the form's own paths
 * ("base.dataset_id" → "dataset_id"), and the sweep's ("parameters.0.values", "budget", "" for the whole).
 */
export function splitSweepErrors(errors: Record<string, string>): { job: Record<string, string>; sweep: Record<string, string> } {
  const job: Record<string, string> = {}
  const sweep: Record<string, string> = {}
  for (const [path, text] of Object.entries(errors)) {
    if (path === 'base' || path.startsWith('base.')) job[path.replace(/^base\.?/, '')] = text
    else sweep[path] = text
  }
  return { job, sweep }
}
