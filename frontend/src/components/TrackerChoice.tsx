import { useResource } from '../useResource'
import type { Tracker, TrackerOption } from '../types'

/**
 * The experiment trackers a new job logs to: the ones the studio offers (GET /api/trackers), each with
 * where its runs go; MLflow stays off, with what an admin sets, until it is set up.
 */
export function TrackerChoice({ chosen, error, onChange }: {
  chosen: Tracker[]
  error?: string
  onChange: (trackers: Tracker[]) => void
}) {
  const options = useResource<TrackerOption[]>('/api/trackers')
  const toggle = (name: Tracker, on: boolean) =>
    onChange(on ? [...chosen.filter((t) => t !== name), name] : chosen.filter((t) => t !== name))
  return (
    <fieldset className="choices" aria-describedby="trackers-help">
      <legend>Experiment trackers</legend>
      {options.error && <p className="error-text">Could not load the trackers: {options.error}</p>}
      {(options.data ?? []).map((option) => (
        <label key={option.name} className={`choice choice--inline${chosen.includes(option.name) ? ' choice--selected' : ''}`}>
          <input type="checkbox" name="trackers" value={option.name} checked={chosen.includes(option.name)}
            disabled={!option.available && !chosen.includes(option.name)}
            onChange={(e) => toggle(option.name, e.target.checked)} />
          <span className="choice__label">{option.label}</span>
          <span className="choice__hint">{option.detail}</span>
        </label>
      ))}
      {error && <p className="error-text" role="alert">{error}</p>}
      <p id="trackers-help" className="muted small">
        The run’s settings, every step’s metrics and links to its artifacts here. A tracker that cannot be reached is a warning in the log; the job goes on.
      </p>
    </fieldset>
  )
}
