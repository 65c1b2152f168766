import { describe, expect, it } from 'vitest'
import type { StreamEvent } from '../types'
import { applyExportEvents, emptyExportLive, exportStages, stageName } from './exportEvents'

const progress = (ms: number, stage: string, fraction: number): StreamEvent => ({ id: `${ms}-0`, type: 'progress', data: { stage, fraction } })

describe('exportStages', () => {
  it('lists the stages the export pipeline reports for the chosen outputs', () => {
    expect(exportStages({ adapter: true, merged: true, gguf_types: ['f16', 'q8_0', 'q4_k_m'], verify: true })).toEqual([
      'check', 'adapter', 'merge', 'verify-merged', 'gguf-f16', 'gguf-q8_0', 'quantize-q4_k_m', 'verify-gguf', 'done'])
    expect(exportStages({ adapter: true, merged: false, gguf_types: [], verify: true })).toEqual(['check', 'adapter', 'done'])
    expect(exportStages({ adapter: false, merged: false, gguf_types: ['q4_k_m'], verify: false })).toEqual([
      'check', 'merge', 'gguf-f16', 'quantize-q4_k_m', 'done'])
  })
})

describe('applyExportEvents', () => {
  const options = { adapter: true, merged: true, gguf_types: [], verify: true }

  it('follows the stages to the end, never going backwards, and keeps the verification', () => {
    let live = emptyExportLive(options) // check, adapter, merge, verify-merged, done
    live = applyExportEvents(live, [{ id: '1-0', type: 'status', data: { status: 'running' } }, progress(2, 'check', 1), progress(3, 'adapter', 0.5)])
    expect(live.stage).toBe('adapter')
    expect(live.overall).toBeCloseTo(1.5 / 5)
    expect(stageName(live.stage!)).toBe('Writing the adapter')
    live = applyExportEvents(live, [progress(4, 'merge', 0.3), progress(5, 'verify-merged', 1)])
    expect(live.overall).toBeCloseTo(4 / 5)
    const replayed = applyExportEvents(live, [progress(3, 'adapter', 0.5)]) // a reconnect replays old events
    expect(replayed).toBe(live)
    live = applyExportEvents(live, [
      { id: '6-0', type: 'verification', data: { merged: { passed: true } } },
      progress(7, 'done', 1),
      { id: '8-0', type: 'status', data: { status: 'succeeded', error: null } },
    ])
    expect(live.overall).toBe(1)
    expect(live.status).toBe('succeeded')
    expect(live.verification).toEqual({ merged: { passed: true } })
  })

  it('takes in a stage it did not expect before "done"', () => {
    const live = applyExportEvents(emptyExportLive({ adapter: true, merged: false, gguf_types: [] }), [progress(1, 'cleanup', 0.5)])
    expect(live.stages).toEqual(['check', 'adapter', 'cleanup', 'done'])
    expect(live.overall).toBeCloseTo(2.5 / 4)
  })

  it('keeps the reason of a failed export', () => {
    const live = applyExportEvents(emptyExportLive(options), [{ id: '1-0', type: 'status', data: { status: 'failed', error: 'Export: disk full' } }])
    expect(live.error).toBe('Export: disk full')
  })
})
