import { useEffect, useRef } from 'react'
import { useResource } from '../useResource'
import type { TrackerRun } from '../types'

const LABELS: Record<TrackerRun['tracker'], string> = { mlflow: 'MLflow', tensorboard: 'TensorBoard', wandb: 'Weights & Biases' }
const FILES: Record<TrackerRun['tracker'], string> = {
  mlflow: '',
  tensorboard: 'its event files are among the artifacts once the job ends',
  wandb: 'its offline run is among the artifacts once the job ends (wandb sync uploads it)',
}

/**
 * A job's runs in the experiment trackers it chose: the MLflow run's page and why a tracker stopped
 * logging. TensorBoard's and W&B's files are the job's artifacts (ArtifactList downloads them). Hidden
 * when the job chose none.
 */
export function TrackerRuns({ jobId, refresh }: { jobId: number; refresh?: unknown }) {
  const runs = useResource<TrackerRun[]>(`/api/jobs/${jobId}/trackers`)
  const { reload } = runs
  const first = useRef(true)
  useEffect(() => { // read again when the job's status changes (the first read is useResource's)
    if (first.current) first.current = false
    else void reload()
  }, [refresh, reload])
  if (!runs.error && !runs.data?.length) return null
  return (
    <section className="panel" aria-labelledby="trackers-heading" data-testid="tracker-runs">
      <header className="panel__header"><h2 id="trackers-heading">Experiment trackers</h2></header>
      <div className="panel__body">
        {runs.error && <p className="error-text">Could not load the trackers: {runs.error}</p>}
        <ul className="tracker-runs">
          {(runs.data ?? []).map((run) => (
            <li key={run.tracker}>
              <strong>{LABELS[run.tracker]}</strong>{' '}
              <span className={`badge badge--${run.status === 'unavailable' ? 'failed' : run.status === 'finished' ? 'succeeded' : run.status}`}>{run.status}</span>{' '}
              {run.url && <a href={run.url} target="_blank" rel="noopener noreferrer">Open the run</a>}
              {FILES[run.tracker] && run.status !== 'unavailable' && <span className="muted small">{FILES[run.tracker]}</span>}
              {run.problem && <p className="error-text small">Stopped logging: {run.problem}</p>}
            </li>
          ))}
        </ul>
      </div>
    </section>
  )
}
