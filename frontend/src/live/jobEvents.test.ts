import { describe, expect, it } from 'vitest'
import type { StreamEvent } from '../types'
import { applyJobEvents, emptyJobLive, memoryPeakGiB, remainingSeconds } from './jobEvents'
import { compareStreamIds } from './streamIds'

const T0 = 1_700_000_000_000

function metric(ms: number, seq: number, data: Record<string, unknown>): StreamEvent {
  return { id: `${T0 + ms}-${seq}`, type: 'metric', data }
}

const events: StreamEvent[] = [
  { id: `${T0}-0`, type: 'status', data: { status: 'running', error: null } },
  { id: `${T0 + 500}-0`, type: 'log', data: { level: 'info', message: 'Training for 3 steps', time: '2026-11-29T12:00:00Z' } },
  metric(1000, 0, { step: 1, loss: 2.5, learning_rate: 2e-4, grad_norm: 1.2, tokens_per_second: 900 }),
  { id: `${T0 + 1500}-0`, type: 'device', data: { kind: 'cpu', cpu_percent: 95, memory_used_bytes: 2 * 1024 ** 3, memory_total_bytes: 24 * 1024 ** 3, process_rss_bytes: 1024 ** 3 } },
  metric(2000, 0, { step: 2, loss: 2.1, learning_rate: 1e-4, grad_norm: 0.9, tokens_per_second: 1000 }),
  metric(2000, 1, { step: 2, eval_loss: 2.3, eval_runtime: 0.5 }),
]

describe('stream ids', () => {
  it('order by milliseconds then sequence', () => {
    expect(compareStreamIds('10-0', '9-5')).toBeGreaterThan(0)
    expect(compareStreamIds('10-1', '10-2')).toBeLessThan(0)
    expect(compareStreamIds('10-1', '10-1')).toBe(0)
  })
})

describe('memoryPeakGiB', () => {
  it("is the job's processes' resident memory on the CPU (not the machine's) and the GPU's memory in use on a GPU", () => {
    const device = { t: [1, 2], utilisation: [50, 60], memoryUsedGiB: [2.2, 2.1], processMemoryGiB: [1.1, 1.3],
      processPeakGiB: [null, null], memoryTotalGiB: [24, 24] }
    expect(memoryPeakGiB(device, 'cpu')).toBe(1.3)
    expect(memoryPeakGiB(device, 'cuda')).toBe(2.2)
    expect(memoryPeakGiB({ ...device, processPeakGiB: [1.2, 1.6] }, 'cpu')).toBe(1.6)  // a step's peak between samples
    expect(memoryPeakGiB({ ...device, processMemoryGiB: [null, null] }, 'cpu')).toBeNull()
  })
})

describe('applyJobEvents', () => {
  it('turns metrics, device samples, logs and status into chart columns on one time axis', () => {
    const live = applyJobEvents(emptyJobLive(), events)
    expect(live.metrics.t).toEqual([1, 2, 2])
    expect(live.metrics.loss).toEqual([2.5, 2.1, null])
    expect(live.metrics.evalLoss).toEqual([null, null, 2.3])
    expect(live.metrics.tokensPerSecond).toEqual([900, 1000, null])
    expect(live.device.t).toEqual([1.5])
    expect(live.device.utilisation).toEqual([95])
    expect(live.device.memoryUsedGiB).toEqual([2])
    expect(live.device.processMemoryGiB).toEqual([1])
    expect(live.memoryTotalBytes).toBe(24 * 1024 ** 3)
    expect(live.deviceKind).toBe('cpu')
    expect(live.logs.map((l) => l.message)).toEqual(['Training for 3 steps'])
    expect(live.status).toBe('running')
    expect(live.lastMetric).toMatchObject({ step: 2, loss: 2.1 })
    expect(live.lastId).toBe(`${T0 + 2000}-1`)
  })

  it('gives the same state whether events come at once, in pieces, or replayed again from the start', () => {
    const once = applyJobEvents(emptyJobLive(), events)
    let pieces = emptyJobLive()
    for (const event of events) pieces = applyJobEvents(pieces, [event])
    // A reconnect with after=0-0 replays everything: nothing may be counted twice.
    const replayed = applyJobEvents(applyJobEvents(once, events.slice(0, 3)), events)
    expect(pieces).toEqual(once)
    expect(replayed).toEqual(once)
    expect(replayed.eventCount).toBe(events.length)
  })

  it('sorts a batch that arrives out of order and drops repeats inside it', () => {
    const shuffled = [events[4]!, events[2]!, events[2]!, events[0]!]
    const live = applyJobEvents(emptyJobLive(), shuffled)
    expect(live.metrics.loss).toEqual([2.5, 2.1])
    expect(live.eventCount).toBe(3)
  })

  it('returns the same object when nothing is new', () => {
    const live = applyJobEvents(emptyJobLive(), events)
    expect(applyJobEvents(live, events.slice(2))).toBe(live)
  })

  it('keeps only the last 500 log lines', () => {
    const many: StreamEvent[] = Array.from({ length: 620 }, (_, i) => ({
      id: `${T0 + i}-0`, type: 'log', data: { message: `line ${i}` },
    }))
    const live = applyJobEvents(emptyJobLive(), many)
    expect(live.logs).toHaveLength(500)
    expect(live.logs[0]!.message).toBe('line 120')
  })
})

describe('remainingSeconds', () => {
  it('extrapolates the pace so far', () => {
    expect(remainingSeconds(10, 40, 20)).toBe(60)
    expect(remainingSeconds(0, 40, 20)).toBeNull()
    expect(remainingSeconds(10, null, 20)).toBeNull()
  })
})

describe("an export job's verification", () => {
  it('keeps each format with its figures for the job page', () => {
    const merged = { status: 'failed' as const, reason: 'does not match', advice: 'use the adapter', figures: [
      { figure: 'max |logit diff|', measured: 0.5, bound: 0.4, within: 'at most' as const, passed: false, meaning: 'm' }] }
    const live = applyJobEvents(emptyJobLive(), [
      { id: '5-0', type: 'verification', data: { formats: { merged } } },
      { id: '6-0', type: 'status', data: { status: 'failed', error: 'Export: …' } },
    ])
    expect(live.formats).toEqual({ merged })
  })
})
