import { ApiError, getJson } from './api'
import type { Evaluation } from './types'

/** GET /api/jobs/{id}/evaluation; null when the job has none (404). */
export async function fetchEvaluation(jobId: number | string, signal?: AbortSignal): Promise<Evaluation | null> {
  try {
    return await getJson<Evaluation>(`/api/jobs/${jobId}/evaluation`, signal)
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) return null
    throw err
  }
}

/** The relative change from base to tuned (-0.25 = a quarter lower); null when either is unknown. */
export function relativeChange(base: number | null | undefined, tuned: number | null | undefined): number | null {
  if (base == null || tuned == null || !Number.isFinite(base) || !Number.isFinite(tuned) || base === 0) return null
  return (tuned - base) / Math.abs(base)
}

/** "−12.3 %" / "+4.0 %"; an em dash when unknown. */
export function formatChange(change: number | null): string {
  if (change == null) return '—'
  const percent = (change * 100).toFixed(1)
  return change > 0 ? `+${percent} %` : `${percent.replace('-', '−')} %`
}
