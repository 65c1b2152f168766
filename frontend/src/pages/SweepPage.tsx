import { useCallback, useEffect, useMemo, useRef, useState } from 'react'
import { Link, useParams } from 'react-router'
import { getJson, postJson } from '../api'
import { mayManage, useAuth } from '../auth'
import { overlay, RUN_COLORS, type CurveKey } from '../compare'
import { ErrorNotice, errorText } from '../components/Field'
import { JobStatusBadge } from '../components/JobStatusBadge'
import { LiveChart } from '../components/LiveChart'
import { PageHeader } from '../components/PageHeader'
import { formatFloat } from '../format'
import { FINAL_STATUSES } from '../live/jobEvents'
import { fetchMetricHistory } from '../live/useJobHistory'
import { fieldLabel } from '../sweepForm'
import type { MetricRow, Sweep, SweepRanking } from '../types'

const REFRESH_MS = 5000
const CURVES: { key: CurveKey; title: string; testId: string }[] = [
  { key: 'loss', title: 'Training loss', testId: 'sweep-loss' },
  { key: 'eval_loss', title: 'Eval loss', testId: 'sweep-eval-loss' },
]

function formatValue(value: unknown): string {
  return typeof value === 'number' ? formatFloat(value) : String(value ?? '—')
}

/** A sweep: its runs ranked by a metric with the best marked, and their loss curves on one step axis. */
export function SweepPage() {
  const { id = '' } = useParams()
  const { user } = useAuth()
  const [sweep, setSweep] = useState<Sweep | null>(null)
  const [ranking, setRanking] = useState<SweepRanking | null>(null)
  const [metrics, setMetrics] = useState<Record<number, MetricRow[]>>({})
  const [metric, setMetric] = useState<string | null>(null)
  const [error, setError] = useState<string | null>(null)
  const [busy, setBusy] = useState(false)

  // A finished run's history does not change: it is read once, not at every refresh.
  const finishedHistories = useRef<Record<number, MetricRow[]>>({})

  const load = useCallback(async (signal?: AbortSignal) => {
    try {
      const query = metric ? `?metric=${encodeURIComponent(metric)}` : ''
      const [found, ranked] = await Promise.all([
        getJson<Sweep>(`/api/sweeps/${id}`, signal),
        getJson<SweepRanking>(`/api/sweeps/${id}/ranking${query}`, signal),
      ])
      const done = new Set(ranked.runs.filter((run) => FINAL_STATUSES.includes(run.status)).map((run) => run.job_id))
      const histories = await Promise.all(found.job_ids.map((jobId) =>
        finishedHistories.current[jobId] ?? fetchMetricHistory(jobId, signal)))
      found.job_ids.forEach((jobId, i) => {
        if (done.has(jobId)) finishedHistories.current[jobId] = histories[i]!
      })
      setSweep(found)
      setRanking(ranked)
      setMetrics(Object.fromEntries(found.job_ids.map((jobId, i) => [jobId, histories[i]!])))
      setError(null)
    } catch (err) {
      if (!signal?.aborted) setError(`Could not load sweep ${id}: ${errorText(err)}`)
    }
  }, [id, metric])

  const live = sweep ? sweep.status === 'queued' || sweep.status === 'running' : true
  useEffect(() => {
    const abort = new AbortController()
    void load(abort.signal)
    const timer = live ? window.setInterval(() => void load(abort.signal), REFRESH_MS) : undefined
    return () => {
      abort.abort()
      window.clearInterval(timer)
    }
  }, [load, live])

  async function cancel() {
    if (!sweep || !window.confirm(`Cancel sweep ${sweep.id}? Its queued runs are cancelled; running ones finish.`)) return
    setBusy(true)
    try {
      setSweep(await postJson<Sweep>(`/api/sweeps/${sweep.id}/cancel`, {}))
      await load()
    } catch (err) {
      setError(`Could not cancel the sweep: ${errorText(err)}`)
    } finally {
      setBusy(false)
    }
  }

  const jobIds = sweep?.job_ids ?? []
  const series = jobIds.map((jobId, i) => ({ label: `#${jobId}`, color: RUN_COLORS[i % RUN_COLORS.length]!, spanGaps: true, points: true }))
  const curves = useMemo(() => CURVES.map((c) => ({ ...c, data: overlay(jobIds.map((jobId) => metrics[jobId] ?? []), c.key) })),
    // eslint-disable-next-line react-hooks/exhaustive-deps
    [metrics, jobIds.join(',')])
  const swept = sweep?.parameters.map((p) => p.field) ?? []
  const canManage = sweep ? mayManage(user, sweep.owner_id) : false

  return (
    <>
      <PageHeader
        title={sweep ? sweep.name : `Sweep ${id}`}
        description={sweep
          ? <>Sweep #{sweep.id} · {sweep.strategy} search over {swept.map(fieldLabel).join(', ')} · {sweep.job_ids.length} runs · <JobStatusBadge status={sweep.status} testId="sweep-status" /></>
          : 'Loading…'}
        actions={sweep && canManage && live && !sweep.cancelled_at && (
          <button type="button" className="button button--danger" disabled={busy} onClick={() => void cancel()}>Cancel sweep</button>
        )}
      />
      <ErrorNotice error={error} />
      {sweep?.cancelled_at && <p className="notice" role="status">Cancelled: its queued runs will not run; the runs that had started finish.</p>}

      {ranking && (
        <section className="panel" aria-labelledby="ranking-heading">
          <header className="panel__header">
            <h2 id="ranking-heading">Ranking</h2>
            <label className="small">
              Rank by{' '}
              <select aria-label="Rank by" value={ranking.metric} onChange={(e) => setMetric(e.target.value)}>
                {[...new Set([ranking.metric, ...ranking.metrics])].map((m) => <option key={m} value={m}>{m}</option>)}
              </select>{' '}
              <span className="muted">({ranking.direction === 'minimize' ? 'lowest' : 'highest'} is best)</span>
            </label>
          </header>
          <div className="panel__body table-scroll">
            <table className="table table--compact" aria-label="Runs ranked" data-testid="sweep-ranking">
              <thead>
                <tr>
                  <th scope="col">Rank</th><th scope="col">Run</th>
                  {swept.map((f) => <th key={f} scope="col">{fieldLabel(f)}</th>)}
                  <th scope="col">{ranking.metric}</th><th scope="col">Status</th>
                </tr>
              </thead>
              <tbody>
                {ranking.runs.map((run) => (
                  <tr key={run.job_id} data-best={run.best || undefined} className={run.best ? 'sweep-ranking__best' : undefined}>
                    <td className="mono">{run.rank ?? '—'}{run.best && <span className="badge badge--succeeded sweep-ranking__mark" title="the best finished run"> ★ best</span>}</td>
                    <td><Link to={`/jobs/${run.job_id}`}>#{run.job_id}</Link></td>
                    {swept.map((f) => <td key={f} className="mono">{formatValue(run.values[f])}</td>)}
                    <td className="mono">{run.value == null ? <span className="muted">not yet</span> : formatFloat(run.value)}</td>
                    <td><JobStatusBadge status={run.status} testId={`run-status-${run.job_id}`} /></td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        </section>
      )}

      {sweep && (
        <div className="grid grid--charts" data-testid="sweep-charts">
          {curves.filter((c) => c.key === 'loss' || c.data[0].length > 0).map((c) => (
            <LiveChart key={`${c.key}-${jobIds.join(',')}`} title={c.title} testId={c.testId} data={c.data} series={series}
              xLabel="step" yFormat={formatFloat} syncKey="sweep" />
          ))}
        </div>
      )}
      {sweep && <p className="muted small"><Link to={`/compare?jobs=${jobIds.slice(0, 8).join(',')}`}>Compare the runs’ settings…</Link></p>}
    </>
  )
}
