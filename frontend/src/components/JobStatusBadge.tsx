import type { JobStatus } from '../types'

/** The job's status as a coloured word (colour is never the only cue: the word is there). */
export function JobStatusBadge({ status, cancelRequested, testId = 'job-status' }: { status: JobStatus | string; cancelRequested?: boolean; testId?: string }) {
  const label = cancelRequested && status === 'running' ? 'cancelling' : status
  return (
    <span className={`badge badge--${status}`} data-testid={testId}>
      {label}
    </span>
  )
}

/** A thin progress bar with its numbers as text. */
export function ProgressBar({ value, max, label }: { value: number; max: number | null; label?: string }) {
  const fraction = max ? Math.min(Math.max(value / max, 0), 1) : 0
  return (
    <div className="progress" title={label}>
      <div
        className="progress__bar"
        role="progressbar"
        aria-valuemin={0}
        aria-valuemax={max ?? undefined}
        aria-valuenow={max ? value : undefined}
        aria-label={label}
      >
        <div className="progress__fill" style={{ width: `${(fraction * 100).toFixed(1)}%` }} />
      </div>
      <span className="progress__text mono">{max ? `${value}/${max}` : value > 0 ? `step ${value}` : '—'}</span>
    </div>
  )
}
