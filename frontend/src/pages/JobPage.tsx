import { useCallback, useEffect, useMemo, useRef, useState } from 'react'
import { Link, useNavigate, useParams } from 'react-router'
import type uPlot from 'uplot'
import { ApiError, getJson, postJson } from '../api'
import { mayManage, useAuth } from '../auth'
import { ArtifactList } from '../components/ArtifactList'
import { CheckpointList } from '../components/CheckpointList'
import { EvaluationSection } from '../components/EvaluationSection'
import { ExportOutcomeTable } from '../components/ExportOutcomeTable'
import { ExportPanel, fetchExports, savedWeights } from '../components/ExportPanel'
import { GrpoPanel } from '../components/GrpoPanel'
import { RewardModelPanel } from '../components/RewardModelPanel'
import { RouterBalancePanel } from '../components/RouterBalancePanel'
import { ErrorNotice, errorText } from '../components/Field'
import { JobStatusBadge, ProgressBar } from '../components/JobStatusBadge'
import { LiveChart } from '../components/LiveChart'
import { PageHeader } from '../components/PageHeader'
import { TrackerRuns } from '../components/TrackerRuns'
import { clock, formatDuration, formatGiB, formatFloat, formatRate, formatTime, parseApiTime, requeueSummary } from '../format'
import { memoryTotalBytes, withHistory } from '../live/history'
import { FINAL_STATUSES, MEMORY_COUNTS, memoryPeakGiB, remainingSeconds } from '../live/jobEvents'
import { useJobHistory } from '../live/useJobHistory'
import { useJobStream } from '../live/useJobStream'
import type { Artifact, Job } from '../types'
import { deviceLabel, jobDevice, modelLabel } from './QueuePage'


const LOSS = [
  { label: 'train loss', color: '#2f6fde' },
  { label: 'eval loss', color: '#d9822b', spanGaps: true, points: true },
]
const LR = [{ label: 'learning rate', color: '#7a4fd6' }]
const GRAD = [{ label: 'grad norm', color: '#c2417a' }]
const TPS = [{ label: 'tokens/s', color: '#1f9d63' }]
const UTIL = [{ label: 'utilisation %', color: '#0f8b8d' }]
const MEM = [
  { label: 'used GiB', color: '#d64545' },
  { label: 'process GiB', color: '#d9822b' },
  { label: 'total GiB', color: '#8a94a3', dash: [6, 4] },
]

export function JobPage() {
  const { id = '' } = useParams()
  const navigate = useNavigate()
  const { user } = useAuth()
  const [job, setJob] = useState<Job | null>(null)
  const [loadError, setLoadError] = useState<string | null>(null)
  const [artifacts, setArtifacts] = useState<Artifact[] | null>(null)
  const [exports, setExports] = useState<Job[] | null>(null)
  const [actionError, setActionError] = useState<string | null>(null)
  const [busy, setBusy] = useState(false)
  const [now, setNow] = useState(() => Date.now())
  const logRef = useRef<HTMLPreElement>(null)
  const stickToBottom = useRef(true)

  const loadJob = useCallback(async () => {
    try {
      const [j, a] = await Promise.all([
        getJson<Job>(`/api/jobs/${id}`),
        getJson<Artifact[]>(`/api/jobs/${id}/artifacts`).catch(() => null),
      ])
      setJob(j)
      if (a) setArtifacts(a)
      setLoadError(null)
      if (j.kind === 'train' && j.status === 'succeeded') {
        const all = await fetchExports().catch(() => null)
        if (all) setExports(all.filter((e) => e.parent_job_id === j.id))
      }
    } catch (err) {
      setLoadError(err instanceof ApiError && err.status === 404 ? `There is no job ${id}: it may have been deleted.` : errorText(err))
    }
  }, [id])

  useEffect(() => {
    setJob(null)
    setArtifacts(null)
    setExports(null)
    void loadJob()
    const tick = setInterval(() => setNow(Date.now()), 1000)
    return () => clearInterval(tick)
  }, [loadJob])

  // The stream says when the status changes; the job row (and its artifacts) is then read again.
  const { live, state, detail } = useJobStream(id, () => {
    void loadJob()
    setTimeout(() => void loadJob(), 1500) // the worker writes the row just after it publishes
  })

  // While running, the step counter and artifacts also come from the row: refresh it now and then.
  useEffect(() => {
    if (!job || FINAL_STATUSES.includes(job.status)) return
    const timer = setInterval(() => void loadJob(), 10_000)
    return () => clearInterval(timer)
  }, [job, loadJob])

  useEffect(() => {
    const el = logRef.current
    if (el && stickToBottom.current) el.scrollTop = el.scrollHeight
  }, [live.logs])

  // The saved history fills in what the stream no longer holds (trimmed, or Redis lost it).
  const finished = job ? FINAL_STATUSES.includes(job.status) : false
  const history = useJobHistory(id, finished)
  const columns = useMemo(() => withHistory(live, history.metrics, history.samples), [live, history])
  const m = columns.metrics
  const d = columns.device
  const tMax = Math.max(m.t.at(-1) ?? 0, d.t.at(-1) ?? 0)
  const xDomain = useMemo<[number, number]>(() => [0, Math.max(tMax, 10)], [tMax])
  const lossData = useMemo<uPlot.AlignedData>(() => [m.t, m.loss, m.evalLoss] as uPlot.AlignedData, [m])
  const lrData = useMemo<uPlot.AlignedData>(() => [m.t, m.learningRate] as uPlot.AlignedData, [m])
  const gradData = useMemo<uPlot.AlignedData>(() => [m.t, m.gradNorm] as uPlot.AlignedData, [m])
  const tpsData = useMemo<uPlot.AlignedData>(() => [m.t, m.tokensPerSecond] as uPlot.AlignedData, [m])
  const utilData = useMemo<uPlot.AlignedData>(() => [d.t, d.utilisation] as uPlot.AlignedData, [d])
  const memData = useMemo<uPlot.AlignedData>(() => [d.t, d.memoryUsedGiB, d.processMemoryGiB, d.memoryTotalGiB] as uPlot.AlignedData, [d])

  async function act(what: 'cancel' | 'retry') {
    if (!job) return
    if (what === 'cancel' && !window.confirm(`Cancel job ${job.id}? A running job saves a checkpoint and stops.`)) return
    setBusy(true)
    setActionError(null)
    try {
      const answer = await postJson<Job>(`/api/jobs/${job.id}/${what}`, {})
      if (what === 'retry') navigate(`/jobs/${answer.id}`)
      else setJob(answer)
    } catch (err) {
      setActionError(`Could not ${what} the job: ${errorText(err)}`)
    } finally {
      setBusy(false)
    }
  }

  if (loadError && !job) {
    return (
      <>
        <PageHeader title={`Job ${id}`} description="A fine-tuning job." />
        <ErrorNotice error={loadError} />
        <p><Link to="/">Back to the queue</Link></p>
      </>
    )
  }

  const last = columns.lastMetric
  const step = typeof last?.step === 'number' ? Math.max(last.step, job?.step ?? 0) : (job?.step ?? 0)
  const total = (typeof last?.total_steps === 'number' ? last.total_steps : null) ?? job?.total_steps ?? null
  const started = parseApiTime(job?.started_at)
  const ended = parseApiTime(job?.finished_at)
  const elapsed = started ? ((ended ?? now) - started) / 1000 : null
  const stepTime = typeof last?.step_time === 'number' ? last.step_time : null
  const remaining = job?.status === 'running'
    ? (stepTime && total ? stepTime * Math.max(total - step, 0) : remainingSeconds(step, total, elapsed ?? 0))
    : null
  const canManage = job ? mayManage(user, job.owner_id) : false
  const memTotal = memoryTotalBytes(live, history.samples) ?? (job && jobDevice(job)?.memory_total_bytes) ?? null
  const deviceKind = live.deviceKind ?? (job && jobDevice(job)?.kind) ?? null
  const peakUsed = memoryPeakGiB(d, deviceKind)
  const counts = MEMORY_COUNTS[deviceKind === 'cpu' ? 'cpu' : 'cuda']
  const checkpoints = artifacts?.filter((a) => a.kind === 'checkpoint') ?? []
  const outputs = artifacts?.filter((a) => a.kind !== 'checkpoint') ?? null

  return (
    <>
      <PageHeader
        title={job ? job.name : `Job ${id}`}
        description={job ? <>Job #{job.id} · <span className="badge">{job.method}</span> {modelLabel(job.model)} · {deviceLabel(job)}</> : 'Loading…'}
        actions={job && (
          <>
            {canManage && (job.status === 'running' || job.status === 'queued') && (
              <button type="button" className="button button--danger" disabled={busy || job.cancel_requested} onClick={() => void act('cancel')}>
                {job.cancel_requested ? 'Cancelling…' : 'Cancel'}
              </button>
            )}
            {canManage && (job.status === 'failed' || job.status === 'cancelled') && (
              <button type="button" className="button" disabled={busy} onClick={() => void act('retry')}>Retry</button>
            )}
            <Link className="button" to={`/jobs/new?clone=${job.id}`}>Clone</Link>
            {job.kind === 'train' && <Link className="button" to={`/compare?jobs=${job.id}`}>Compare…</Link>}
            {job.kind === 'train' && <a className="button" href={`/api/jobs/${job.id}/config?format=yaml`} download>Download YAML</a>}
            {job.kind === 'train' && <a className="button" href={`/api/jobs/${job.id}/config?format=command`} download
              title="A shell command that writes the YAML and queues it with lanner submit">Command line</a>}
          </>
        )}
      />
      <ErrorNotice error={actionError} />
      {job?.error && (job.status === 'queued'
        ? <p className="notice" role="status">{job.error}</p>  // why it waits (the queue writes it)
        : <ErrorNotice title={job.status === 'succeeded' ? 'Finished, with parts left out' : 'The job failed'} error={job.error} />)}
      {job && requeueSummary(job) && <p className="notice" role="status" data-testid="requeues">{requeueSummary(job)}</p>}
      {job?.sweep_id != null && <p className="muted" data-testid="job-sweep">A run of <Link to={`/sweeps/${job.sweep_id}`}>sweep #{job.sweep_id}</Link>.</p>}
      {job?.error && live.formats && <ExportOutcomeTable formats={live.formats} />}
      {job && (
        <section className="panel job-facts" aria-label="Job status">
          <dl className="facts facts--row">
            <div><dt>Status</dt><dd><JobStatusBadge status={job.status} cancelRequested={job.cancel_requested} /></dd></div>
            <div className="facts__progress"><dt>Progress</dt><dd><ProgressBar value={step} max={total} label="Training progress" /></dd></div>
            <div><dt>Elapsed</dt><dd data-testid="elapsed">{formatDuration(elapsed)}</dd></div>
            <div><dt>Remaining</dt><dd data-testid="remaining">{job.status === 'running' ? formatDuration(remaining) : '—'}</dd></div>
            <div><dt>Loss</dt><dd className="mono">{formatFloat(typeof last?.loss === 'number' ? last.loss : null)}</dd></div>
            <div><dt>Tokens/s</dt><dd className="mono">{formatRate(typeof last?.tokens_per_second === 'number' ? last.tokens_per_second : null)}</dd></div>
            <div><dt>{job.status === 'queued' ? 'Queue position' : 'Started'}</dt><dd>{job.status === 'queued' ? (job.queue_position ?? '—') : formatTime(job.started_at)}</dd></div>
            <div><dt>{deviceKind === 'cpu' ? 'Memory' : 'GPU memory'}</dt><dd className="mono" data-testid="memory-facts"
              title={`Peak: ${counts.peak}. Estimate: ${counts.estimate}.`}>
              {peakUsed != null ? `peak ${peakUsed.toFixed(1)}` : '—'}{memTotal ? ` of ${formatGiB(memTotal)}` : ''}
              {job.memory_estimate_bytes ? <span className="muted small"> (estimate {formatGiB(job.memory_estimate_bytes)})</span> : null}
              {peakUsed != null && <span className="muted small" data-testid="memory-counts"> · {counts.peak}</span>}
            </dd></div>
            <div><dt>Stream</dt><dd><span className={`live-dot live-dot--${state}`} data-testid="job-stream">{state === 'open' ? 'live' : state === 'closed' ? (detail ?? 'closed') : state}</span></dd></div>
          </dl>
        </section>
      )}
      <p className="muted small">All charts share one time axis (minutes:seconds since the job’s first event); hover one to see the same moment in all.</p>
      <div className="grid grid--charts">
        <LiveChart title="Loss" testId="chart-loss" data={lossData} series={LOSS} xLabel="time" xFormat={clock} yFormat={formatFloat} syncKey={`job-${id}`} xDomain={xDomain} />
        <LiveChart title="Tokens per second" testId="chart-tps" data={tpsData} series={TPS} xLabel="time" xFormat={clock} yFormat={formatRate} syncKey={`job-${id}`} xDomain={xDomain} />
        <LiveChart title="Learning rate" testId="chart-lr" data={lrData} series={LR} xLabel="time" xFormat={clock} yFormat={formatFloat} yTickFormat={formatFloat} syncKey={`job-${id}`} xDomain={xDomain} />
        <LiveChart title="Gradient norm" testId="chart-grad" data={gradData} series={GRAD} xLabel="time" xFormat={clock} yFormat={formatFloat} syncKey={`job-${id}`} xDomain={xDomain} />
        <LiveChart title={deviceKind === 'cpu' ? 'CPU utilisation' : 'GPU utilisation'} testId="chart-util" data={utilData} series={UTIL} xLabel="time" xFormat={clock} yFormat={(v) => `${v.toFixed(0)} %`} syncKey={`job-${id}`} xDomain={xDomain} yDomain={[0, 100]} />
        <LiveChart title={`${deviceKind === 'cpu' ? 'Memory' : 'GPU memory'}${memTotal ? ` (of ${(memTotal / 1024 ** 3).toFixed(1)} GiB)` : ''}`} testId="chart-mem" data={memData} series={MEM} xLabel="time" xFormat={clock} yFormat={(v) => `${v.toFixed(2)} GiB`} syncKey={`job-${id}`} xDomain={xDomain} yDomain={[0, 1]} />
      </div>
      {job?.method === 'grpo' && <GrpoPanel metrics={m} completions={live.completions} jobId={id} xDomain={xDomain} />}
      {job?.method === 'reward' && <RewardModelPanel metrics={m} jobId={id} xDomain={xDomain} />}
      <RouterBalancePanel metrics={m} jobId={id} xDomain={xDomain} />
      <div className="grid grid--two">
        <section className="panel" aria-labelledby="log-heading">
          <header className="panel__header">
            <h2 id="log-heading">Log</h2>
            <span className="muted small">last {live.logs.length} lines</span>
          </header>
          <pre className="log" ref={logRef} tabIndex={0} data-testid="job-log" aria-label="Job log"
            onScroll={(e) => { const el = e.currentTarget; stickToBottom.current = el.scrollHeight - el.scrollTop - el.clientHeight < 24 }}>
            {live.logs.length === 0 && <span className="muted">No log lines yet.</span>}
            {live.logs.map((line) => (
              <div key={line.id} className={`log__line log__line--${line.level}`}>
                <span className="log__time">{line.time ? line.time.slice(11, 19) : ''}</span> {line.message}
              </div>
            ))}
          </pre>
        </section>
        <section className="panel" aria-labelledby="artifacts-heading">
          <header className="panel__header"><h2 id="artifacts-heading">Artifacts</h2></header>
          <div className="panel__body">
            <ArtifactList artifacts={outputs} finished={finished} />
          </div>
        </section>
      </div>
      {job && job.kind === 'train' && (
        <section className="panel" aria-labelledby="checkpoints-heading">
          <header className="panel__header"><h2 id="checkpoints-heading">Checkpoints</h2></header>
          <div className="panel__body"><CheckpointList job={job} checkpoints={checkpoints} canManage={canManage} /></div>
        </section>
      )}
      {job && job.kind === 'train' && (
        <section className="panel" aria-labelledby="export-heading">
          <header className="panel__header"><h2 id="export-heading">Export</h2></header>
          <div className="panel__body">
            <ExportPanel job={job} exports={exports} saved={savedWeights(artifacts)}
              onExported={(e) => setExports((list) => [e, ...(list ?? [])])} />
          </div>
        </section>
      )}
      {job && job.kind === 'train' && <EvaluationSection jobId={job.id} refresh={job.status} />}
      {job && job.kind === 'train' && <TrackerRuns jobId={job.id} refresh={job.status} />}
      {job && (
        <details className="details panel">
          <summary>Configuration</summary>
          <pre className="config mono">{JSON.stringify(job.config, null, 2)}</pre>
        </details>
      )}
    </>
  )
}
