import type { WorkerInfo } from './types'

export interface DeviceFit {
  worker: string
  device: string
  kind: string
  totalBytes: number | null
  /** null when it cannot be judged: no estimate, no known memory, or a device of the other kind. */
  fits: boolean | null
  /** Share of the device's memory the estimate takes (0.5 = half). */
  share: number | null
}

/**
 * Whether an estimate fits each worker's device. A GPU job's estimate is judged against the GPUs
 * and a CPU job's against the CPU workers' memory; the other kind cannot run it.
 */
export function deviceFits(estimateBytes: number | null, estimateDevice: string, workers: WorkerInfo[]): DeviceFit[] {
  return workers.map((w) => {
    const total = w.device.memory_total_bytes
    const sameKind = w.device.kind === estimateDevice
    const judged = sameKind && estimateBytes != null && total != null && total > 0
    return {
      worker: w.name,
      device: w.device.kind === 'cuda' && w.device.index != null ? `cuda:${w.device.index} · ${w.device.name}` : `${w.device.kind} · ${w.device.name}`,
      kind: w.device.kind,
      totalBytes: total,
      fits: judged ? estimateBytes! <= total! : null,
      share: judged ? estimateBytes! / total! : null,
    }
  })
}
