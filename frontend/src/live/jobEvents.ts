import type { CompletionSamples, FormatOutcome, StreamEvent } from '../types'
import { compareStreamIds, streamIdTime } from './streamIds'

/** Column arrays for the charts; x is seconds since the job's first event. */
export interface MetricColumns {
  t: number[]
  step: number[]
  loss: (number | null)[]
  evalLoss: (number | null)[]
  learningRate: (number | null)[]
  gradNorm: (number | null)[]
  tokensPerSecond: (number | null)[]
  /** Each point's values as logged, for the method's own charts (GRPO's rewards, KL, …). */
  values: Record<string, unknown>[]
}


export interface DeviceColumns {
  t: number[]
  /** GPU utilisation, or the CPU's, in percent. */
  utilisation: (number | null)[]
  memoryUsedGiB: (number | null)[]
  /** The training process's own memory (CPU runs report it). */
  processMemoryGiB: (number | null)[]
  /** Its highest resident memory so far (Linux keeps it), the peak that samples apart can miss. */
  processPeakGiB: (number | null)[]
  memoryTotalGiB: (number | null)[]
}

export interface LogLine {
  id: string
  level: string
  message: string
  time: string | null
}

export interface JobLive {
  /** Id of the last event applied; later batches at or before it are dropped. */
  lastId: string | null
  /** Epoch ms of the first event: time zero of every chart. */
  t0: number | null
  metrics: MetricColumns
  device: DeviceColumns
  /** "cuda" or "cpu", from the device samples. */
  deviceKind: string | null
  memoryTotalBytes: number | null
  logs: LogLine[]
  /** Latest status seen on the stream (the job row is the truth; this only says "refetch it"). */
  status: string | null
  error: string | null
  /** The last training metric's values (step, loss, tokens/s, total_steps…). */
  lastMetric: Record<string, unknown> | null
  /** An export job's formats, kept or left out with its checks' figures (its verification event). */
  formats: Record<string, FormatOutcome> | null
  /** GRPO's sampled completions, the newest MAX_COMPLETION_STEPS logged steps. */
  completions: CompletionSamples[]
  eventCount: number
}

/** The statuses a job does not leave. */
export const FINAL_STATUSES: string[] = ['succeeded', 'failed', 'cancelled']

export const MAX_LOG_LINES = 500
export const MAX_COMPLETION_STEPS = 50
const GIB = 1024 ** 3

export function emptyJobLive(): JobLive {
  return {
    lastId: null,
    t0: null,
    metrics: { t: [], step: [], loss: [], evalLoss: [], learningRate: [], gradNorm: [], tokensPerSecond: [], values: [] },
    device: { t: [], utilisation: [], memoryUsedGiB: [], processMemoryGiB: [], processPeakGiB: [], memoryTotalGiB: [] },
    deviceKind: null,
    memoryTotalBytes: null,
    logs: [],
    status: null,
    error: null,
    lastMetric: null,
    formats: null,
    completions: [],
    eventCount: 0,
  }
}

function num(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) ? value : null
}

function gib(value: unknown): number | null {
  const n = num(value)
  return n == null ? null : n / GIB
}

/** The chart values of one metric event (or saved metric row); eval rows carry only eval_loss. */
export function metricPoint(data: Record<string, unknown>) {
  const isEval = data.eval_loss !== undefined && data.loss === undefined
  return {
    isEval,
    loss: isEval ? null : num(data.loss),
    evalLoss: num(data.eval_loss),
    learningRate: isEval ? null : num(data.learning_rate),
    gradNorm: isEval ? null : num(data.grad_norm),
    tokensPerSecond: isEval ? null : num(data.tokens_per_second),
    values: data,
  }
}

/** The chart values of one device sample: a GPU's, or on a CPU box the process's. */
export function devicePoint(data: Record<string, unknown>) {
  return {
    utilisation: num(data.gpu_utilization_percent) ?? num(data.process_cpu_percent) ?? num(data.cpu_percent),
    memoryUsedGiB: gib(data.memory_used_bytes),
    processMemoryGiB: gib(data.process_rss_bytes),
    processPeakGiB: gib(data.process_peak_rss_bytes),
    memoryTotalGiB: gib(data.memory_total_bytes),
  }
}

/**
 * Applies a batch of a job's events, in stream order, to its live state. Events at or before the
 * last applied id are skipped, so replaying the whole stream after a reconnect (after=0-0) on top of
 * what is already shown changes nothing; the result is as if each event had been seen once.
 * Returns the same object when nothing changed.
 */
export function applyJobEvents(state: JobLive, events: StreamEvent[]): JobLive {
  const fresh = events
    .filter((e) => state.lastId == null || compareStreamIds(e.id, state.lastId) > 0)
    .sort((a, b) => compareStreamIds(a.id, b.id))
  // The server never repeats an id, but a batch could hold one twice if two sockets overlapped.
  const unique = fresh.filter((e, i) => i === 0 || e.id !== fresh[i - 1]!.id)
  if (unique.length === 0) return state

  const m = state.metrics
  const d = state.device
  const metrics: MetricColumns = {
    t: [...m.t], step: [...m.step], loss: [...m.loss], evalLoss: [...m.evalLoss],
    learningRate: [...m.learningRate], gradNorm: [...m.gradNorm], tokensPerSecond: [...m.tokensPerSecond],
    values: [...m.values],
  }
  const device: DeviceColumns = {
    t: [...d.t], utilisation: [...d.utilisation], memoryUsedGiB: [...d.memoryUsedGiB],
    processMemoryGiB: [...d.processMemoryGiB], processPeakGiB: [...d.processPeakGiB], memoryTotalGiB: [...d.memoryTotalGiB],
  }
  let logs = state.logs
  let { t0, deviceKind, memoryTotalBytes, status, error, lastMetric, formats, completions } = state
  const newLogs: LogLine[] = []

  for (const event of unique) {
    const at = streamIdTime(event.id) ?? 0
    if (t0 == null) t0 = at
    const t = (at - t0) / 1000
    if (event.type === 'metric') {
      const point = metricPoint(event.data)
      metrics.t.push(t)
      metrics.step.push(num(event.data.step) ?? (metrics.step.at(-1) ?? 0))
      metrics.loss.push(point.loss)
      metrics.evalLoss.push(point.evalLoss)
      metrics.learningRate.push(point.learningRate)
      metrics.gradNorm.push(point.gradNorm)
      metrics.tokensPerSecond.push(point.tokensPerSecond)
      metrics.values.push(point.values)
      if (!point.isEval) lastMetric = event.data
    } else if (event.type === 'device') {
      const kind = typeof event.data.kind === 'string' ? event.data.kind : null
      deviceKind = kind ?? deviceKind
      const total = num(event.data.memory_total_bytes)
      if (total != null) memoryTotalBytes = total
      const point = devicePoint(event.data)
      device.t.push(t)
      device.utilisation.push(point.utilisation)
      device.memoryUsedGiB.push(point.memoryUsedGiB)
      device.processMemoryGiB.push(point.processMemoryGiB)
      device.processPeakGiB.push(point.processPeakGiB)
      device.memoryTotalGiB.push(point.memoryTotalGiB)
    } else if (event.type === 'log') {
      newLogs.push({
        id: event.id,
        level: typeof event.data.level === 'string' ? event.data.level : 'info',
        message: typeof event.data.message === 'string' ? event.data.message : JSON.stringify(event.data),
        time: typeof event.data.time === 'string' ? event.data.time : null,
      })
    } else if (event.type === 'status') {
      status = typeof event.data.status === 'string' ? event.data.status : status
      error = typeof event.data.error === 'string' ? event.data.error : null
    } else if (event.type === 'verification') {
      formats = event.data.formats ?? null
    } else if (event.type === 'completions') {
      const { step, samples } = event.data
      if (typeof step === 'number') completions = [...completions, { step, samples: samples ?? [] }].slice(-MAX_COMPLETION_STEPS)
    }
  }
  if (newLogs.length > 0) logs = [...logs, ...newLogs].slice(-MAX_LOG_LINES)
  return {
    lastId: unique.at(-1)!.id,
    t0,
    metrics,
    device,
    deviceKind,
    memoryTotalBytes,
    logs,
    status,
    error,
    lastMetric,
    formats,
    completions,
    eventCount: state.eventCount + unique.length,
  }
}

/** Seconds left, judged by the pace so far; null when there is nothing to judge by. */
export function remainingSeconds(step: number, totalSteps: number | null, elapsedSeconds: number): number | null {
  if (!totalSteps || step <= 0 || elapsedSeconds <= 0) return null
  return (elapsedSeconds / step) * Math.max(totalSteps - step, 0)
}

/** What a job's memory peak and its estimate count, on each kind of device: the same things, so
 * that the two compare (lanner.core.memory_estimate). */
export const MEMORY_COUNTS = {
  cpu: {
    peak: "resident memory (RSS) of the job's processes",
    estimate: 'weights, adapter, gradients, optimizer state, activations and logits, plus the Python and PyTorch runtime',
  },
  cuda: {
    peak: 'memory in use on the GPU (NVML)',
    estimate: 'weights, adapter, gradients, optimizer state, activations and logits, plus the CUDA context',
  },
} as const

/** The job's memory peak in GiB: on the CPU its processes' resident memory (not the machine's, which
 * other programs share) at its highest, as the kernel kept it when it did; on a GPU the memory in use on it. */
export function memoryPeakGiB(device: DeviceColumns, kind: string | null): number | null {
  const values = kind === 'cpu' ? [...device.processMemoryGiB, ...device.processPeakGiB] : device.memoryUsedGiB
  return values.reduce<number | null>((a, b) => (b == null ? a : Math.max(a ?? 0, b)), null)
}
