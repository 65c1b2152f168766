import { parseApiTime } from '../format'
import type { MetricRow, SampleRow } from '../types'
import { devicePoint, metricPoint, type DeviceColumns, type JobLive, type MetricColumns } from './jobEvents'

/** What the charts draw: the live stream's columns with the database's history filled in. */
export interface ChartColumns {
  metrics: MetricColumns
  device: DeviceColumns
  /** The last training metric's values, from the stream or else from the history. */
  lastMetric: Record<string, unknown> | null
}

interface MetricAt {
  t: number
  step: number
  point: ReturnType<typeof metricPoint>
}

function metricKey(step: number, isEval: boolean): string {
  return `${step}:${isEval ? 'eval' : 'train'}`
}

/**
 * Merges the saved history of a job (GET /api/jobs/{id}/metrics and /device-samples) under its
 * live stream. The stream is the source of truth for what it still holds; the history supplies what
 * it no longer has (Redis trimmed or lost the stream): metric steps the stream lacks, and device
 * samples older than the stream's first. Both share one time axis, zero at the earliest event.
 */
export function withHistory(live: JobLive, metrics: MetricRow[], samples: SampleRow[]): ChartColumns {
  const m = live.metrics
  const seen = new Set<string>()
  for (let i = 0; i < m.t.length; i++) seen.add(metricKey(m.step[i]!, m.loss[i] == null && m.evalLoss[i] != null))

  const oldMetrics = metrics
    .map((row) => ({ row, at: parseApiTime(row.time), point: metricPoint(row.values) }))
    .filter((x): x is typeof x & { at: number } => x.at != null && !seen.has(metricKey(x.row.step, x.point.isEval)))
  const firstLiveSample = live.t0 != null && live.device.t.length > 0 ? live.t0 + live.device.t[0]! * 1000 : null
  const oldSamples = samples
    .map((row) => ({ row, at: parseApiTime(row.time) }))
    .filter((x): x is typeof x & { at: number } => x.at != null && (firstLiveSample == null || x.at < firstLiveSample))

  if (oldMetrics.length === 0 && oldSamples.length === 0) {
    return { metrics: live.metrics, device: live.device, lastMetric: live.lastMetric }
  }
  const starts = [live.t0, oldMetrics[0]?.at, oldSamples[0]?.at].filter((v): v is number => v != null)
  const t0 = Math.min(...starts)
  const shift = live.t0 != null ? (live.t0 - t0) / 1000 : 0

  const points: MetricAt[] = oldMetrics.map(({ row, at, point }) => ({ t: (at - t0) / 1000, step: row.step, point }))
  for (let i = 0; i < m.t.length; i++) {
    points.push({
      t: m.t[i]! + shift,
      step: m.step[i]!,
      point: { isEval: false, loss: m.loss[i]!, evalLoss: m.evalLoss[i]!, learningRate: m.learningRate[i]!, gradNorm: m.gradNorm[i]!, tokensPerSecond: m.tokensPerSecond[i]!, values: m.values[i]! },
    })
  }
  points.sort((a, b) => a.t - b.t || a.step - b.step)
  const merged: MetricColumns = {
    t: points.map((p) => p.t),
    step: points.map((p) => p.step),
    loss: points.map((p) => p.point.loss),
    evalLoss: points.map((p) => p.point.evalLoss),
    learningRate: points.map((p) => p.point.learningRate),
    gradNorm: points.map((p) => p.point.gradNorm),
    tokensPerSecond: points.map((p) => p.point.tokensPerSecond),
    values: points.map((p) => p.point.values),
  }

  const d = live.device
  const device: DeviceColumns = { t: [], utilisation: [], memoryUsedGiB: [], processMemoryGiB: [], processPeakGiB: [], memoryTotalGiB: [] }
  for (const { row, at } of oldSamples) {
    const p = devicePoint(row.values)
    device.t.push((at - t0) / 1000)
    device.utilisation.push(p.utilisation)
    device.memoryUsedGiB.push(p.memoryUsedGiB)
    device.processMemoryGiB.push(p.processMemoryGiB)
    device.processPeakGiB.push(p.processPeakGiB)
    device.memoryTotalGiB.push(p.memoryTotalGiB)
  }
  device.t.push(...d.t.map((t) => t + shift))
  device.utilisation.push(...d.utilisation)
  device.memoryUsedGiB.push(...d.memoryUsedGiB)
  device.processMemoryGiB.push(...d.processMemoryGiB)
  device.processPeakGiB.push(...d.processPeakGiB)
  device.memoryTotalGiB.push(...d.memoryTotalGiB)

  const lastTrain = [...oldMetrics].reverse().find((x) => !x.point.isEval)
  const lastMetric = live.lastMetric ?? (lastTrain ? { step: lastTrain.row.step, ...lastTrain.row.values } : null)
  return { metrics: merged, device, lastMetric }
}

/** The memory total the device samples report, newest first; null when none says. */
export function memoryTotalBytes(live: JobLive, samples: SampleRow[]): number | null {
  if (live.memoryTotalBytes != null) return live.memoryTotalBytes
  for (let i = samples.length - 1; i >= 0; i--) {
    const total = samples[i]!.values.memory_total_bytes
    if (typeof total === 'number' && Number.isFinite(total)) return total
  }
  return null
}
