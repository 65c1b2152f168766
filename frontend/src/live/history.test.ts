import { describe, expect, it } from 'vitest'
import type { MetricRow, SampleRow, StreamEvent } from '../types'
import { withHistory } from './history'
import { applyJobEvents, emptyJobLive } from './jobEvents'

const T0 = Date.parse('2026-11-29T12:00:00Z')
const iso = (ms: number) => new Date(T0 + ms).toISOString()

function row(step: number, ms: number, values: Record<string, unknown>): MetricRow {
  return { step, time: iso(ms), values }
}

const history: MetricRow[] = [
  row(1, 1000, { loss: 3.0, learning_rate: 2e-4, tokens_per_second: 800 }),
  row(2, 2000, { loss: 2.5, learning_rate: 1e-4, tokens_per_second: 900 }),
  row(2, 2001, { eval_loss: 2.7 }),
  row(3, 3000, { loss: 2.1, learning_rate: 5e-5, tokens_per_second: 950 }),
]
const samples: SampleRow[] = [
  { id: 1, time: iso(500), values: { kind: 'cuda', gpu_utilization_percent: 90, memory_used_bytes: 2 * 1024 ** 3, memory_total_bytes: 80 * 1024 ** 3 } },
  { id: 2, time: iso(2500), values: { kind: 'cuda', gpu_utilization_percent: 95, memory_used_bytes: 3 * 1024 ** 3, memory_total_bytes: 80 * 1024 ** 3 } },
]

describe('withHistory', () => {
  it('draws a finished job whose stream is gone from its saved history alone', () => {
    const cols = withHistory(emptyJobLive(), history, samples)
    expect(cols.metrics.step).toEqual([1, 2, 2, 3])
    expect(cols.metrics.t).toEqual([0.5, 1.5, 1.501, 2.5]) // zero is the first saved event, a device sample
    expect(cols.metrics.loss).toEqual([3.0, 2.5, null, 2.1])
    expect(cols.metrics.evalLoss).toEqual([null, null, 2.7, null])
    expect(cols.device.t).toEqual([0, 2])
    expect(cols.device.memoryUsedGiB).toEqual([2, 3])
    expect(cols.lastMetric).toMatchObject({ step: 3, loss: 2.1 })
  })

  it('adds only the steps a trimmed stream lacks, on one time axis, without doubling any', () => {
    // The stream was trimmed: it still holds step 3 (published at 3000 ms) and a later device sample.
    const stream: StreamEvent[] = [
      { id: `${T0 + 2999}-0`, type: 'metric', data: { step: 3, loss: 2.1, learning_rate: 5e-5, tokens_per_second: 950 } },
      { id: `${T0 + 3500}-0`, type: 'device', data: { kind: 'cuda', gpu_utilization_percent: 97, memory_used_bytes: 4 * 1024 ** 3 } },
    ]
    const live = applyJobEvents(emptyJobLive(), stream)
    const cols = withHistory(live, history, [...samples, { id: 3, time: iso(3501), values: { memory_used_bytes: 4 * 1024 ** 3 } }])
    expect(cols.metrics.step).toEqual([1, 2, 2, 3])
    expect(cols.metrics.t).toEqual([0.5, 1.5, 1.501, 2.499])
    expect(cols.device.t).toEqual([0, 2, 3]) // the saved copy of the streamed sample is left out
    expect(cols.lastMetric).toMatchObject({ step: 3 })
  })

  it('leaves a whole stream as it is', () => {
    const stream: StreamEvent[] = history.map((r, i) => ({ id: `${T0 + Date.parse(r.time) - T0 - 1}-${i}`, type: 'metric', data: { step: r.step, ...r.values } }))
    const live = applyJobEvents(emptyJobLive(), stream)
    const cols = withHistory(live, history, [])
    expect(cols.metrics).toBe(live.metrics)
  })
})
