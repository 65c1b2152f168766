import { useEffect, useRef } from 'react'
import { useResource } from '../useResource'
import type { TrackerRun } from '../types'

const LABELS: Record<TrackerRun['tracker'], string> = { mlflow: 'MLflow', tensorboard: 'TensorBoard', wandb: 'Weights & Biases' }
const DOWNLOAD_TEXT: Record<TrackerRun['tracker'], string> = {
  mlflow: '', tensorboard: 'Event files (.tar)', wandb: 'Offline run (.tar, for wandb sync)',
}

/**
 * A job's runs in the experiment trackers it chose: the MLflow run's page, the TensorBoard and W&B
 * files to download, and why a tracker stopped logging. Hidden when the job chose none.
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
              {run.download && <a href={run.download} download>{DOWNLOAD_TEXT[run.tracker]}</a>}
              {run.problem && <p className="error-text small">Stopped logging: {run.problem}</p>}
            </li>
          ))}
        </ul>
      </div>
    </section>
  )
}
