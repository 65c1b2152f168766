import { formatAge, formatGiB } from '../format'
import type { HealthState } from '../health'
import type { WorkerInfo } from '../types'

function deviceLabel(worker: WorkerInfo): string {
  const { kind, name, index } = worker.device
  const slot = kind === 'cuda' && index != null ? `cuda:${index}` : kind
  return `${slot} · ${name}`
}

/** The workers the backend knows about and the device each one owns. */
export function HardwarePanel({ state }: { state: HealthState }) {
  const { health, error, checkedAt } = state
  const workers = health?.workers ?? []

  let body
  if (!health && !error) {
    body = <p className="muted">Checking workers…</p>
  } else if (!health && error) {
    body = <p className="error-text">Cannot reach the backend: {error}</p>
  } else if (workers.length === 0) {
    body = (
      <p className="muted">No workers connected. Queued jobs start when a worker joins.</p>
    )
  } else {
    body = (
      <table className="table">
        <thead>
          <tr>
            <th scope="col">Worker</th>
            <th scope="col">Device</th>
            <th scope="col" className="num">
              Memory
            </th>
            <th scope="col">Last seen</th>
          </tr>
        </thead>
        <tbody>
          {workers.map((worker) => (
            <tr key={worker.name}>
              <td className="mono">{worker.name}</td>
              <td className="nowrap">{deviceLabel(worker)}</td>
              <td className="num mono">{formatGiB(worker.device.memory_total_bytes)}</td>
              <td className="muted nowrap" title={worker.last_seen}>
                {formatAge(worker.last_seen, checkedAt ?? Date.now())}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    )
  }

  return (
    <section className="panel" aria-labelledby="hardware-heading" data-testid="workers">
      <header className="panel__header">
        <h2 id="hardware-heading">Hardware</h2>
        {health && error && <span className="error-text small">stale — backend unreachable</span>}
      </header>
      <div className="panel__body">{body}</div>
    </section>
  )
}
