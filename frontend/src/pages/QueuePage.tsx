import { useCallback, useEffect, useMemo, useRef, useState } from 'react'
import { Link, useNavigate } from 'react-router'
import { getJson, postJson } from '../api'
import { mayManage, useAuth } from '../auth'
import { EmptyState } from '../components/EmptyState'
import { ErrorNotice, errorText } from '../components/Field'
import { HardwarePanel } from '../components/HardwarePanel'
import { JobStatusBadge, ProgressBar } from '../components/JobStatusBadge'
import { PageHeader } from '../components/PageHeader'
import { formatDuration, formatRate, formatTime, parseApiTime } from '../format'
import { useHealth } from '../health'
import { remainingSeconds } from '../live/jobEvents'
import { useQueueStream, useRunningMetrics, type RunningMetrics } from '../live/useQueueLive'
import type { Job, JobPage, QueueSnapshot, Sweep, SweepPage, User, WorkerDevice } from '../types'

const FINISHED_SHOWN = 25
const SWEEPS_SHOWN = 10
const POLL_MS = 15_000

export function modelLabel(model: string): string {
  if (model.startsWith('builtin/')) return `${model.slice(8)} (built in)`
  return model.split('/').filter(Boolean).at(-1) ?? model
}

/** Where the job runs. JobOut.device is an untyped dict in the API's document: read as the worker's Device. */
export function jobDevice(job: Job): WorkerDevice | null {
  return job.device as WorkerDevice | null
}

/** Where the job runs: its device, and the worker host it is on (several hosts share one queue). */
export function deviceLabel(job: Job): string {
  const device = jobDevice(job)
  const on = device?.host ? ` on ${device.host}` : ''
  if (device?.kind === 'cuda') return `cuda:${device.index ?? '?'}${device.name ? ` · ${device.name}` : ''}${on}`
  if (device?.kind) return `${device.kind}${on}`
  if (job.worker) return job.worker.split('@')[0] ?? job.worker
  return job.gpus === 0 ? 'CPU' : job.gpus === 1 ? '1 GPU' : `${job.gpus} GPUs`
}

interface Row {
  job: Job
  live?: RunningMetrics
}

export function QueuePage() {
  const health = useHealth()
  const { user } = useAuth()
  const navigate = useNavigate()
  const [queue, setQueue] = useState<QueueSnapshot | null>(null)
  const [finished, setFinished] = useState<Job[] | null>(null)
  const [sweeps, setSweeps] = useState<Sweep[] | null>(null)
  const [users, setUsers] = useState<Record<number, User>>({})
  const [loadError, setLoadError] = useState<string | null>(null)
  const [actionError, setActionError] = useState<string | null>(null)
  const [busy, setBusy] = useState<number | null>(null)
  const [now, setNow] = useState(() => Date.now())
  const reloadTimer = useRef<ReturnType<typeof setTimeout> | undefined>(undefined)

  const load = useCallback(async () => {
    try {
      const [snapshot, done, recentSweeps] = await Promise.all([
        getJson<QueueSnapshot>('/api/queue'),
        getJson<JobPage>(`/api/jobs?status=succeeded&status=failed&status=cancelled&limit=${FINISHED_SHOWN}`),
        getJson<SweepPage>(`/api/sweeps?limit=${SWEEPS_SHOWN}`),
      ])
      setQueue(snapshot)
      setFinished(done.items)
      setSweeps(recentSweeps.items)
      setLoadError(null)
    } catch (err) {
      setLoadError(errorText(err))
    }
  }, [])

  // Many events can arrive at once (a burst of reorders); one reload covers them all.
  const scheduleLoad = useCallback(() => {
    clearTimeout(reloadTimer.current)
    reloadTimer.current = setTimeout(() => void load(), 150)
  }, [load])

  useEffect(() => {
    void load()
    getJson<User[]>('/api/users')
      .then((list) => setUsers(Object.fromEntries(list.map((u) => [u.id, u]))))
      .catch(() => {})
    const poll = setInterval(() => void load(), POLL_MS)
    const tick = setInterval(() => setNow(Date.now()), 1000)
    return () => {
      clearInterval(poll)
      clearInterval(tick)
      clearTimeout(reloadTimer.current)
    }
  }, [load])

  const streamState = useQueueStream(scheduleLoad)
  const runningIds = useMemo(() => (queue?.running ?? []).map((j) => j.id), [queue])
  const live = useRunningMetrics(runningIds, scheduleLoad)

  async function act(job: Job, what: string, path: string, body: unknown = {}) {
    setBusy(job.id)
    setActionError(null)
    try {
      const answer = await postJson<Job>(path, body)
      if (what === 'retry') navigate(`/jobs/${answer.id}`)
      else await load()
    } catch (err) {
      setActionError(`Could not ${what} job ${job.id} (${job.name}): ${errorText(err)}`)
    } finally {
      setBusy(null)
    }
  }

  function owner(job: { owner_id: number }): string {
    const u = users[job.owner_id]
    if (!u) return `user ${job.owner_id}`
    return u.id === user?.id ? `${u.display_name} (you)` : u.display_name
  }

  function eta(row: Row): string {
    const { job, live: m } = row
    const step = m?.step ?? job.step
    const total = m?.totalSteps ?? job.total_steps
    if (m?.stepTime && total && step != null) return formatDuration(m.stepTime * Math.max(total - step, 0))
    const started = parseApiTime(job.started_at)
    if (started == null) return '—'
    return formatDuration(remainingSeconds(step, total, (now - started) / 1000))
  }

  function actions(job: Job, position?: number, count?: number) {
    if (!mayManage(user, job.owner_id)) return null
    const disabled = busy === job.id
    const label = `job ${job.id}`
    return (
      <div className="row-actions">
        {job.status === 'queued' && (
          <>
            <button type="button" className="button button--small button--icon" disabled={disabled || position === 1}
              aria-label={`Move ${label} up`} title="Move up" onClick={() => void act(job, 'move', `/api/jobs/${job.id}/move`, { move: 'up' })}>↑</button>
            <button type="button" className="button button--small button--icon" disabled={disabled || position === count}
              aria-label={`Move ${label} down`} title="Move down" onClick={() => void act(job, 'move', `/api/jobs/${job.id}/move`, { move: 'down' })}>↓</button>
            <button type="button" className="button button--small button--icon" disabled={disabled || position === 1}
              aria-label={`Move ${label} to the top`} title="Run next" onClick={() => void act(job, 'move', `/api/jobs/${job.id}/move`, { move: 'top' })}>⇡</button>
          </>
        )}
        {(job.status === 'queued' || job.status === 'running') && (
          <button type="button" className="button button--small button--danger" disabled={disabled || job.cancel_requested}
            aria-label={`Cancel ${label}`} onClick={() => {
              if (window.confirm(`Cancel job ${job.id} (${job.name})?`)) void act(job, 'cancel', `/api/jobs/${job.id}/cancel`)
            }}>Cancel</button>
        )}
        {(job.status === 'failed' || job.status === 'cancelled') && (
          <button type="button" className="button button--small" disabled={disabled}
            aria-label={`Retry ${label}`} onClick={() => void act(job, 'retry', `/api/jobs/${job.id}/retry`)}>Retry</button>
        )}
      </div>
    )
  }

  function jobCell(job: Job) {
    return (
      <td>
        <Link to={`/jobs/${job.id}`} className="job-link">{job.name}</Link>
        <div className="muted small mono">#{job.id}</div>
      </td>
    )
  }

  const running: Row[] = (queue?.running ?? []).map((job) => ({ job, live: live[job.id] }))
  const queued = queue?.queued ?? []
  const empty = queue && finished && running.length === 0 && queued.length === 0 && finished.length === 0

  return (
    <>
      <PageHeader
        title="Queue"
        description="Fine-tuning and export jobs of the whole team, in the order the workers will run them."
        actions={
          <>
            <span className={`live-dot live-dot--${streamState}`} data-testid="queue-stream" title="Live updates from the server">
              {streamState === 'open' ? 'live' : streamState === 'closed' ? 'offline' : 'connecting…'}
            </span>
            <Link to="/jobs/new" className="button button--primary">
              New fine-tune
            </Link>
          </>
        }
      />
      <ErrorNotice error={actionError} />
      {loadError && <ErrorNotice error={`Could not load the queue: ${loadError}`} />}
      <div className="stack">
        <div className="stack">
          {!queue && !loadError && <p className="muted">Loading the queue…</p>}
          {empty && (
            <EmptyState title="No jobs yet">
              <p>
                Pick a model and a dataset to start one: <Link to="/jobs/new">New fine-tune</Link>.
              </p>
            </EmptyState>
          )}
          {running.length > 0 && (
            <section className="panel" aria-labelledby="running-heading">
              <header className="panel__header"><h2 id="running-heading">Running ({running.length})</h2></header>
              <div className="table-scroll"><table className="table" data-testid="running-jobs">
                <thead>
                  <tr>
                    <th scope="col">Job</th><th scope="col">Owner</th><th scope="col">Method · model</th>
                    <th scope="col">Device</th><th scope="col">Progress</th><th scope="col" className="num">Tokens/s</th>
                    <th scope="col" className="num">ETA</th><th scope="col"><span className="visually-hidden">Actions</span></th>
                  </tr>
                </thead>
                <tbody>
                  {running.map((row) => (
                    <tr key={row.job.id}>
                      {jobCell(row.job)}
                      <td>{owner(row.job)}</td>
                      <td><span className="badge">{row.job.method}</span> {modelLabel(row.job.model)}</td>
                      <td className="nowrap">{deviceLabel(row.job)}</td>
                      <td>
                        <JobStatusBadge status={row.job.status} cancelRequested={row.job.cancel_requested} />
                        <ProgressBar value={row.live?.step ?? row.job.step} max={row.live?.totalSteps ?? row.job.total_steps} label={`Progress of job ${row.job.id}`} />
                      </td>
                      <td className="num mono">{formatRate(row.live?.tokensPerSecond)}</td>
                      <td className="num">{eta(row)}</td>
                      <td>{actions(row.job)}</td>
                    </tr>
                  ))}
                </tbody>
              </table></div>
            </section>
          )}
          {queued.length > 0 && (
            <section className="panel" aria-labelledby="queued-heading">
              <header className="panel__header"><h2 id="queued-heading">Queued ({queued.length})</h2></header>
              <div className="table-scroll"><table className="table" data-testid="queued-jobs">
                <thead>
                  <tr>
                    <th scope="col" className="num">#</th><th scope="col">Job</th><th scope="col">Owner</th>
                    <th scope="col">Method · model</th><th scope="col">Device</th><th scope="col">Priority</th>
                    <th scope="col">Starts</th><th scope="col"><span className="visually-hidden">Actions</span></th>
                  </tr>
                </thead>
                <tbody>
                  {queued.map((job, index) => (
                    <tr key={job.id}>
                      <td className="num mono" aria-label="Queue position">{job.queue_position ?? index + 1}</td>
                      {jobCell(job)}
                      <td>{owner(job)}</td>
                      <td><span className="badge">{job.method}</span> {modelLabel(job.model)}</td>
                      <td className="nowrap">{deviceLabel(job)}</td>
                      <td className="mono">{job.priority}</td>
                      <td className="nowrap">
                        {job.estimated_start ? `≈ ${formatTime(job.estimated_start)}` : 'when a worker is free'}
                        {job.error && <div className="muted small clamp" title={job.error}>{job.error}</div>}
                      </td>
                      <td>{actions(job, job.queue_position ?? index + 1, queued.length)}</td>
                    </tr>
                  ))}
                </tbody>
              </table></div>
            </section>
          )}
          {sweeps && sweeps.length > 0 && (
            <section className="panel" aria-labelledby="sweeps-heading">
              <header className="panel__header"><h2 id="sweeps-heading">Sweeps (latest {sweeps.length})</h2></header>
              <div className="table-scroll"><table className="table" data-testid="sweeps">
                <thead>
                  <tr><th scope="col">Sweep</th><th scope="col">Owner</th><th scope="col">Search</th><th scope="col">Runs</th><th scope="col">Status</th></tr>
                </thead>
                <tbody>
                  {sweeps.map((sweep) => (
                    <tr key={sweep.id}>
                      <td><Link to={`/sweeps/${sweep.id}`}>{sweep.name}</Link> <span className="muted mono small">#{sweep.id}</span></td>
                      <td>{owner(sweep)}</td>
                      <td>{sweep.strategy} · {sweep.parameters.map((p) => p.field.split('.').at(-1)).join(', ')} · by {sweep.metric}</td>
                      <td className="nowrap">{Object.entries(sweep.runs_by_status).map(([status, count]) => `${count} ${status}`).join(', ')}</td>
                      <td><JobStatusBadge status={sweep.status} testId={`sweep-status-${sweep.id}`} /></td>
                    </tr>
                  ))}
                </tbody>
              </table></div>
            </section>
          )}
          {finished && finished.length > 0 && (
            <section className="panel" aria-labelledby="finished-heading">
              <header className="panel__header"><h2 id="finished-heading">Finished (latest {finished.length})</h2></header>
              <div className="table-scroll"><table className="table" data-testid="finished-jobs">
                <thead>
                  <tr>
                    <th scope="col">Job</th><th scope="col">Owner</th><th scope="col">Method · model</th>
                    <th scope="col">Device</th><th scope="col">Status</th><th scope="col">Took</th>
                    <th scope="col">Finished</th><th scope="col"><span className="visually-hidden">Actions</span></th>
                  </tr>
                </thead>
                <tbody>
                  {finished.map((job) => {
                    const started = parseApiTime(job.started_at)
                    const ended = parseApiTime(job.finished_at)
                    return (
                      <tr key={job.id}>
                        {jobCell(job)}
                        <td>{owner(job)}</td>
                        <td><span className="badge">{job.method}</span> {modelLabel(job.model)}</td>
                        <td className="nowrap">{deviceLabel(job)}</td>
                        <td>
                          <JobStatusBadge status={job.status} />
                          {job.error && <div className="error-text small clamp" title={job.error}>{job.error}</div>}
                        </td>
                        <td className="nowrap">{started && ended ? formatDuration((ended - started) / 1000) : '—'}</td>
                        <td className="nowrap">{formatTime(job.finished_at)}</td>
                        <td>{actions(job)}</td>
                      </tr>
                    )
                  })}
                </tbody>
              </table></div>
            </section>
          )}
        </div>
        <HardwarePanel state={health} />
      </div>
    </>
  )
}
