import { useEffect, useMemo, useState } from 'react'
import { Link, useSearchParams } from 'react-router'
import { getJson } from '../api'
import { configRows, overlay, parseJobIds, RUN_COLORS, type CurveKey } from '../compare'
import { EmptyState } from '../components/EmptyState'
import { ErrorNotice, errorText } from '../components/Field'
import { JobStatusBadge } from '../components/JobStatusBadge'
import { LiveChart } from '../components/LiveChart'
import { PageHeader } from '../components/PageHeader'
import { fetchEvaluation, formatChange, relativeChange } from '../evaluation'
import { formatFloat, formatTime } from '../format'
import { fetchMetricHistory } from '../live/useJobHistory'
import type { Evaluation, Job, JobPage, MetricRow } from '../types'
import { modelLabel } from './QueuePage'

const MAX_RUNS = RUN_COLORS.length
const PICKABLE = 50
const CURVES: { key: CurveKey; title: string; testId: string }[] = [
  { key: 'loss', title: 'Training loss', testId: 'compare-loss' },
  { key: 'eval_loss', title: 'Eval loss', testId: 'compare-eval-loss' },
  { key: 'learning_rate', title: 'Learning rate', testId: 'compare-lr' },
  // GRPO runs: drawn when a run logged them
  { key: 'reward', title: 'Reward (GRPO)', testId: 'compare-reward' },
  { key: 'kl', title: 'KL to the reference', testId: 'compare-kl' },
  // Reward models: the share of held-out pairs scored the right way round
  { key: 'eval_accuracy', title: 'Held-out accuracy (reward model)', testId: 'compare-eval-accuracy' },
]
const SPARSE: CurveKey[] = ['eval_loss', 'reward', 'kl', 'eval_accuracy']

interface Run {
  job: Job
  metrics: MetricRow[]
  evaluation: Evaluation | null
}

function runLabel(job: Job): string {
  return `#${job.id} ${job.name}`
}

/** Several runs side by side: curves overlaid by step, settings with differences marked, evaluations. */
export function ComparePage() {
  const [params, setParams] = useSearchParams()
  // The selection lives in state and is mirrored to the URL: the router applies URL changes in a
  // transition, so checkboxes driven by the URL alone flip back until it commits.
  const [ids, setIds] = useState<number[]>(() => parseJobIds(params.get('jobs')).slice(0, MAX_RUNS))
  const [candidates, setCandidates] = useState<Job[] | null>(null)
  const [runs, setRuns] = useState<Run[] | null>(null)
  const [error, setError] = useState<string | null>(null)
  const [onlyDifferences, setOnlyDifferences] = useState(false)

  useEffect(() => {
    getJson<JobPage>(`/api/jobs?limit=${PICKABLE}`)
      .then((page) => setCandidates(page.items.filter((job) => job.kind === 'train')))
      .catch((err) => setError(`Could not load the jobs: ${errorText(err)}`))
  }, [])

  useEffect(() => {
    if (ids.length === 0) {
      setRuns([])
      return
    }
    const abort = new AbortController()
    setRuns(null)
    Promise.all(ids.map(async (id): Promise<Run> => {
      const [job, metrics, evaluation] = await Promise.all([
        getJson<Job>(`/api/jobs/${id}`, abort.signal),
        fetchMetricHistory(id, abort.signal),
        fetchEvaluation(id, abort.signal).catch(() => null),
      ])
      return { job, metrics, evaluation }
    }))
      .then((loaded) => {
        setRuns(loaded)
        setError(null)
      })
      .catch((err) => {
        if (!abort.signal.aborted) setError(`Could not load the runs: ${errorText(err)}`)
      })
    return () => abort.abort()
  }, [ids])

  useEffect(() => {
    setParams(ids.length ? { jobs: ids.join(',') } : {}, { replace: true })
  }, [ids, setParams])

  function toggle(id: number, on: boolean) {
    setIds((current) => (on ? [...current.filter((x) => x !== id), id].slice(0, MAX_RUNS) : current.filter((x) => x !== id)))
  }

  const series = (runs ?? []).map((run, i) => ({ label: runLabel(run.job), color: RUN_COLORS[i % RUN_COLORS.length]!, spanGaps: true, points: true }))
  const curves = useMemo(() => CURVES.map((c) => ({ ...c, data: overlay((runs ?? []).map((r) => r.metrics), c.key) })), [runs])
  const rows = useMemo(() => configRows((runs ?? []).map((r) => r.job)), [runs])
  const shownRows = onlyDifferences ? rows.filter((r) => r.differs) : rows
  const differing = rows.filter((r) => r.differs).length
  const evaluated = (runs ?? []).some((r) => r.evaluation)

  return (
    <>
      <PageHeader title="Compare" description="Several runs side by side: their curves on one axis, their settings with the differences marked, and their evaluations." />
      <ErrorNotice error={error} />
      <section className="panel" aria-labelledby="pick-heading">
        <header className="panel__header">
          <h2 id="pick-heading">Runs</h2>
          <span className="muted small">{ids.length} of at most {MAX_RUNS} chosen</span>
        </header>
        <div className="panel__body">
          {!candidates && !error && <p className="muted">Loading…</p>}
          {candidates && candidates.length === 0 && <p className="muted">No fine-tunes yet. <Link to="/jobs/new">Start one</Link>.</p>}
          {candidates && candidates.length > 0 && (
            <div className="table-scroll compare-picker">
              <table className="table table--compact" aria-label="Jobs to compare" data-testid="compare-picker">
                <thead>
                  <tr><th scope="col"><span className="visually-hidden">Compare</span></th><th scope="col">Job</th><th scope="col">Method</th><th scope="col">Model</th><th scope="col">Status</th><th scope="col">Finished</th></tr>
                </thead>
                <tbody>
                  {candidates.map((job) => {
                    const checked = ids.includes(job.id)
                    return (
                      <tr key={job.id}>
                        <td>
                          <input type="checkbox" checked={checked} disabled={!checked && ids.length >= MAX_RUNS}
                            aria-label={`Compare job ${job.id}`} onChange={(e) => toggle(job.id, e.target.checked)} />
                        </td>
                        <td><Link to={`/jobs/${job.id}`}>{job.name}</Link> <span className="muted mono small">#{job.id}</span></td>
                        <td><span className="badge">{job.method}</span></td>
                        <td>{modelLabel(job.model)}</td>
                        <td><JobStatusBadge status={job.status} testId={`compare-status-${job.id}`} /></td>
                        <td className="nowrap">{formatTime(job.finished_at)}</td>
                      </tr>
                    )
                  })}
                </tbody>
              </table>
            </div>
          )}
        </div>
      </section>

      {ids.length === 0 && (
        <EmptyState title="Nothing to compare yet">
          <p>Tick two or more runs above to overlay their curves and set their settings side by side.</p>
        </EmptyState>
      )}
      {ids.length > 0 && !runs && !error && <p className="muted">Loading the runs…</p>}
      {runs && runs.length > 0 && (
        <>
          <p className="muted small">
            Curves are drawn against the optimizer step, so runs of different speed line up.
            {curves.find((c) => c.key === 'eval_loss')!.data[0].length === 0 && ' None of these runs measured an eval loss (set an evaluation share to hold rows out).'}
          </p>
          <div className="grid grid--charts" data-testid="compare-charts">
            {curves.filter((c) => !SPARSE.includes(c.key) || c.data[0].length > 0).map((c) => (
              <LiveChart key={`${c.key}-${ids.join(',')}`} title={c.title} testId={c.testId} data={c.data} series={series}
                xLabel="step" yFormat={formatFloat} yTickFormat={c.key === 'learning_rate' ? formatFloat : undefined} syncKey="compare" />
            ))}
          </div>

          <section className="panel" aria-labelledby="settings-heading">
            <header className="panel__header">
              <h2 id="settings-heading">Settings</h2>
              <label className="check small">
                <input type="checkbox" checked={onlyDifferences} onChange={(e) => setOnlyDifferences(e.target.checked)} /> Only the {differing} that differ
              </label>
            </header>
            <div className="panel__body table-scroll">
              <table className="table table--compact compare-table" aria-label="Settings side by side" data-testid="compare-settings">
                <thead>
                  <tr><th scope="col">Setting</th>{runs.map((r) => <th key={r.job.id} scope="col">{runLabel(r.job)}</th>)}</tr>
                </thead>
                <tbody>
                  {shownRows.map((row) => (
                    <tr key={row.key} className={row.differs ? 'compare-table__differs' : undefined} data-differs={row.differs || undefined}>
                      <th scope="row" className="mono">{row.key}{row.differs && <span className="compare-table__mark" title="differs"> ≠</span>}</th>
                      {row.values.map((v, i) => <td key={i} className="mono">{v}</td>)}
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          </section>

          <section className="panel" aria-labelledby="compare-eval-heading">
            <header className="panel__header"><h2 id="compare-eval-heading">Before and after</h2></header>
            <div className="panel__body table-scroll">
              {!evaluated ? <p className="muted">None of these runs has an evaluation of the base model against the trained one.</p> : (
                <table className="table table--compact" aria-label="Evaluations side by side" data-testid="compare-evaluations">
                  <thead>
                    <tr><th scope="col">Measure</th>{runs.map((r) => <th key={r.job.id} scope="col">{runLabel(r.job)}</th>)}</tr>
                  </thead>
                  <tbody>
                    <EvalRow label="Eval loss, base" runs={runs} value={(e) => formatFloat(e.base_eval_loss)} />
                    <EvalRow label="Eval loss, trained" runs={runs} value={(e) => formatFloat(e.tuned_eval_loss)} />
                    <EvalRow label="Eval loss change" runs={runs} value={(e) => formatChange(relativeChange(e.base_eval_loss, e.tuned_eval_loss))} />
                    <EvalRow label="Overlap with reference, base" runs={runs} value={(e) => formatFloat(e.scores?.base_overlap)} />
                    <EvalRow label="Overlap with reference, trained" runs={runs} value={(e) => formatFloat(e.scores?.tuned_overlap)} />
                    <EvalRow label="Samples" runs={runs} value={(e) => String(e.samples.length)} />
                  </tbody>
                </table>
              )}
            </div>
          </section>
        </>
      )}
    </>
  )
}

function EvalRow({ label, runs, value }: { label: string; runs: Run[]; value: (e: Evaluation) => string }) {
  return (
    <tr>
      <th scope="row">{label}</th>
      {runs.map((r) => (
        <td key={r.job.id} className="mono">
          {!r.evaluation ? <span className="muted">none</span> : r.evaluation.status === 'done' ? value(r.evaluation) : <span className="muted">{r.evaluation.status}</span>}
        </td>
      ))}
    </tr>
  )
}
