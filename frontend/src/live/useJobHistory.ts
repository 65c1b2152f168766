import { useEffect, useState } from 'react'
import { getJson } from '../api'
import type { MetricRow, SampleRow } from '../types'

const PAGE = 5000
const MAX_PAGES = 20

/** Every saved metric of a job, paging on the last step seen. */
export async function fetchMetricHistory(jobId: string | number, signal?: AbortSignal): Promise<MetricRow[]> {
  const rows: MetricRow[] = []
  let after = -1
  for (let page = 0; page < MAX_PAGES; page++) {
    const batch = await getJson<MetricRow[]>(`/api/jobs/${jobId}/metrics?after_step=${after}&limit=${PAGE}`, signal)
    rows.push(...batch)
    if (batch.length < PAGE) break
    after = batch.at(-1)!.step
  }
  return rows
}

async function fetchSampleHistory(jobId: string, signal: AbortSignal): Promise<SampleRow[]> {
  const rows: SampleRow[] = []
  let after = 0
  for (let page = 0; page < MAX_PAGES; page++) {
    const batch = await getJson<SampleRow[]>(`/api/jobs/${jobId}/device-samples?after_id=${after}&limit=${PAGE}`, signal)
    rows.push(...batch)
    if (batch.length < PAGE) break
    after = batch.at(-1)!.id
  }
  return rows
}

/**
 * A job's saved metrics and device samples, read when the page opens and again when `refresh`
 * changes (the job finished). A failure leaves the history empty: the live stream still draws.
 */
export function useJobHistory(jobId: string, refresh: unknown): { metrics: MetricRow[]; samples: SampleRow[] } {
  const [history, setHistory] = useState<{ metrics: MetricRow[]; samples: SampleRow[] }>({ metrics: [], samples: [] })
  useEffect(() => {
    const abort = new AbortController()
    Promise.all([fetchMetricHistory(jobId, abort.signal), fetchSampleHistory(jobId, abort.signal)])
      .then(([metrics, samples]) => setHistory({ metrics, samples }))
      .catch(() => undefined)
    return () => abort.abort()
  }, [jobId, refresh])
  return history
}
