/**
 * An export job's stream as progress: the stages it will go through (known from its options, in
 * lanner.worker.export.pipeline's order), the one it is in and how far, its verification.
 */
import type { ExportOptions, FormatOutcome, StreamEvent } from '../types'
import { compareStreamIds } from './streamIds'

const OWN_GGUF_TYPES = new Set(['f16', 'bf16', 'q8_0'])

/** The stages an export with these options reports, in order. */
export function exportStages(options: Partial<ExportOptions>): string[] {
  const gguf = options.gguf_types ?? []
  const verify = options.verify ?? true
  const stages = ['check']
  if (options.adapter ?? true) stages.push('adapter')
  if ((options.merged ?? true) || gguf.length > 0) {
    stages.push('merge')
    if (verify) stages.push('verify-merged')
  }
  if (gguf.length > 0) {
    // Every quant type is made from the one f16 conversion, which is always made.
    const converted = ['f16', ...gguf.filter((t) => OWN_GGUF_TYPES.has(t) && t !== 'f16')]
    stages.push(...converted.map((t) => `gguf-${t}`))
    stages.push(...gguf.filter((t) => !OWN_GGUF_TYPES.has(t)).map((t) => `quantize-${t}`))
    if (verify) stages.push('verify-gguf')
  }
  stages.push('done')
  return stages
}

const STAGE_NAMES: Record<string, string> = {
  check: 'Checking free disk space',
  adapter: 'Writing the adapter',
  merge: 'Merging the adapter into the base model',
  'verify-merged': 'Verifying the merged model',
  'verify-gguf': 'Verifying the GGUF files with llama.cpp',
  done: 'Done',
}

export function stageName(stage: string): string {
  if (STAGE_NAMES[stage]) return STAGE_NAMES[stage]
  if (stage.startsWith('gguf-')) return `Converting to GGUF ${stage.slice(5)}`
  if (stage.startsWith('quantize-')) return `Quantizing to ${stage.slice(9)}`
  return stage
}

export interface ExportLive {
  lastId: string | null
  stages: string[]
  stage: string | null
  /** Of the current stage, 0–1. */
  stageFraction: number
  /** Of the whole export, 0–1. */
  overall: number
  status: string | null
  error: string | null
  verification: Record<string, unknown> | null
  /** Each format asked for, kept or left out with its check's figures (the verification event's). */
  formats: Record<string, FormatOutcome> | null
  lastLog: string | null
}

export function emptyExportLive(options: Partial<ExportOptions>): ExportLive {
  return { lastId: null, stages: exportStages(options), stage: null, stageFraction: 0, overall: 0, status: null, error: null, verification: null, formats: null, lastLog: null }
}

/** Applies a batch of an export job's events; events at or before the last applied id are skipped. */
export function applyExportEvents(state: ExportLive, events: StreamEvent[]): ExportLive {
  const fresh = events
    .filter((e) => state.lastId == null || compareStreamIds(e.id, state.lastId) > 0)
    .sort((a, b) => compareStreamIds(a.id, b.id))
  if (fresh.length === 0) return state
  const next = { ...state, stages: [...state.stages] }
  for (const event of fresh) {
    if (event.type === 'progress' && typeof event.data.stage === 'string') {
      if (!next.stages.includes(event.data.stage)) next.stages.splice(Math.max(next.stages.length - 1, 0), 0, event.data.stage)
      next.stage = event.data.stage
      next.stageFraction = typeof event.data.fraction === 'number' ? Math.min(Math.max(event.data.fraction, 0), 1) : 0
      const index = next.stages.indexOf(event.data.stage)
      const overall = event.data.stage === 'done' ? 1 : (index + next.stageFraction) / next.stages.length
      next.overall = Math.max(next.overall, overall)
    } else if (event.type === 'verification') {
      next.verification = event.data
      next.formats = event.data.formats ?? null
    } else if (event.type === 'status') {
      next.status = typeof event.data.status === 'string' ? event.data.status : next.status
      next.error = typeof event.data.error === 'string' ? event.data.error : null
      if (next.status === 'succeeded') next.overall = 1
    } else if (event.type === 'log' && typeof event.data.message === 'string') {
      next.lastLog = event.data.message
    }
  }
  next.lastId = fresh.at(-1)!.id
  return next
}
