import { formatAge, formatGiB } from '../format'
import type { HealthState } from '../health'
import type { WorkerInfo } from '../types'

function deviceLabel(worker: WorkerInfo): string {
  const { kind, name, index } = worker.device
  const slot = kind === 'cuda' && index != null ? `cuda:${index}` : kind
  return `${slot} · ${name}`
}

/** The workers by host, in the order the API lists them (by host, then name). A visitor who is not
 * signed in sees no host names: one group without a heading. */
function byHost(workers: WorkerInfo[]): [string | null, WorkerInfo[]][] {
  const groups = new Map<string | null, WorkerInfo[]>()
  for (const worker of workers) {
    const host = worker.host ?? null
    groups.set(host, [...(groups.get(host) ?? []), worker])
  }
  return [...groups.entries()]
}

function plural(count: number, word: string): string {
  return `${count} ${word}${count === 1 ? '' : 's'}`
}

/** The worker hosts the backend knows about, their workers and the device each one owns. */
export function HardwarePanel({ state }: { state: HealthState }) {
  const { health, error, checkedAt } = state
  const workers = health?.workers ?? []
  const groups = byHost(workers)

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
        {groups.map(([host, members]) => (
          <tbody key={host ?? ''} data-testid={host ? `host-${host}` : undefined}>
            {host && (
              <tr>
                <th scope="rowgroup" colSpan={4}>
                  Host {host} <span className="muted small">· {plural(members.length, 'worker')}</span>
                </th>
              </tr>
            )}
            {members.map((worker) => (
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
        ))}
      </table>
    )
  }

  return (
    <section className="panel" aria-labelledby="hardware-heading" data-testid="workers">
      <header className="panel__header">
        <h2 id="hardware-heading">Hardware</h2>
        {health && error && <span className="error-text small">stale — backend unreachable</span>}
        {groups.length > 1 && <span className="muted small">{plural(groups.length, 'host')}</span>}
      </header>
      <div className="panel__body">{body}</div>
    </section>
  )
}
