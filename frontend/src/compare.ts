/**
 * Compare runs as plain data: several jobs' saved metrics overlaid on one step axis, and their
 * settings side by side with the ones that differ marked.
 */
import type uPlot from 'uplot'
import type { Job, MetricRow } from './types'

export type CurveKey = 'loss' | 'eval_loss' | 'learning_rate' | 'reward' | 'kl' | 'eval_accuracy'

/**
 * uPlot columns for one metric of several runs: x is the union of their steps, each run one
 * series, null where a run has no value at that step (eval loss is sparse; runs differ in length).
 */
export function overlay(runs: MetricRow[][], key: CurveKey): uPlot.AlignedData {
  const byRun = runs.map((rows) => {
    const values = new Map<number, number>()
    for (const row of rows) {
      const value = row.values[key]
      if (typeof value === 'number' && Number.isFinite(value)) values.set(row.step, value)
    }
    return values
  })
  const steps = [...new Set(byRun.flatMap((values) => [...values.keys()]))].sort((a, b) => a - b)
  return [steps, ...byRun.map((values) => steps.map((step) => values.get(step) ?? null))] as uPlot.AlignedData
}

/** The spec fields a comparison leaves out: they name or place the run rather than shape it. */
const NOT_COMPARED = new Set(['name', 'priority', 'resume_from'])
/** The nested spec, not the flat copies for the training process that a job's config also holds. */
const SPEC_KEYS = ['method', 'model', 'dataset_id', 'preset', 'gpus', 'hyperparameters', 'lora', 'preference', 'grpo']

function flatten(value: unknown, prefix: string, out: Map<string, string>) {
  if (value && typeof value === 'object' && !Array.isArray(value)) {
    for (const [key, inner] of Object.entries(value as Record<string, unknown>)) flatten(inner, prefix ? `${prefix}.${key}` : key, out)
  } else if (value !== undefined) {
    // A list of objects (GRPO's reward functions) is shown as JSON, a list of names joined.
    out.set(prefix, value === null ? '—' : Array.isArray(value)
      ? (value.some((v) => v && typeof v === 'object') ? JSON.stringify(value) : value.join(', ')) : String(value))
  }
}

export interface ConfigRow {
  key: string
  /** One per job, in the jobs' order; "—" where the job has no such setting. */
  values: string[]
  differs: boolean
}

/** Every setting of the jobs' specs, one row each, in a stable order; `differs` marks disagreement. */
export function configRows(jobs: Job[]): ConfigRow[] {
  const flat = jobs.map((job) => {
    const out = new Map<string, string>()
    for (const key of SPEC_KEYS) if (!NOT_COMPARED.has(key)) flatten(job.config[key], key, out)
    return out
  })
  const keys: string[] = []
  for (const map of flat) for (const key of map.keys()) if (!keys.includes(key)) keys.push(key)
  return keys.map((key) => {
    const values = flat.map((map) => map.get(key) ?? '—')
    return { key, values, differs: new Set(values).size > 1 }
  })
}

/** Job ids from the page's ?jobs=3,5,8 (unique, positive integers, in order). */
export function parseJobIds(text: string | null): number[] {
  const ids = (text ?? '').split(',').map((part) => Number(part.trim())).filter((n) => Number.isInteger(n) && n > 0)
  return [...new Set(ids)]
}

/** Distinct colours for up to eight runs; canvas needs concrete values. */
export const RUN_COLORS = ['#2f6fde', '#d9822b', '#1f9d63', '#c2417a', '#7a4fd6', '#0f8b8d', '#8a6d1f', '#d64545']
