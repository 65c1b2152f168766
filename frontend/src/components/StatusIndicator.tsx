import { useId } from 'react'
import { healthLabel, type HealthState } from '../health'
import type { LlamaCppStatus, ServiceHealth, WorkerInfo } from '../types'

type PartState = 'ok' | 'pending' | 'down' | 'unknown'

interface Part {
  key: string
  label: string
  state: PartState
  tip: string
}

function serviceTip(name: string, service: ServiceHealth): string {
  if (service.ok) return `${name}: ok — ${service.url}`
  return `${name}: down — ${service.detail ?? 'no detail'} (${service.url})`
}

function workersTip(workers: WorkerInfo[]): string {
  if (workers.length === 0) return 'Workers: none connected — jobs will wait in the queue'
  const names = workers.map((w) => `${w.name} (${w.device.kind})`).join(', ')
  return `Workers: ${workers.length} — ${names}`
}

function llamaCppPart(status: LlamaCppStatus): Part {
  const state = status.state === 'ready' ? 'ok' : status.state === 'building' ? 'pending' : 'down'
  const log = status.log && status.state !== 'ready' ? ` Log: ${status.log}` : ''
  return { key: 'llama-cpp', label: 'llama.cpp', state, tip: `llama.cpp (GGUF k-quants and checks, CPU chat): ${status.detail}${log}` }
}

function workersLabel(count: number): string {
  return count === 1 ? '1 worker' : `${count} workers`
}

/** One dot per part of the system, derived from the last health report. */
export function healthParts(state: HealthState): Part[] {
  const { health, error } = state
  if (error) {
    const tip = `Backend unreachable: ${error}`
    return [
      { key: 'database', label: 'Database', state: 'down', tip },
      { key: 'redis', label: 'Redis', state: 'down', tip },
      { key: 'workers', label: 'Workers', state: 'down', tip },
      { key: 'llama-cpp', label: 'llama.cpp', state: 'down', tip },
    ]
  }
  if (!health) {
    const tip = 'Checking…'
    return [
      { key: 'database', label: 'Database', state: 'unknown', tip },
      { key: 'redis', label: 'Redis', state: 'unknown', tip },
      { key: 'workers', label: 'Workers', state: 'unknown', tip },
      { key: 'llama-cpp', label: 'llama.cpp', state: 'unknown', tip },
    ]
  }
  return [
    {
      key: 'database',
      label: 'Database',
      state: health.database.ok ? 'ok' : 'down',
      tip: serviceTip('Database', health.database),
    },
    {
      key: 'redis',
      label: 'Redis',
      state: health.redis.ok ? 'ok' : 'down',
      tip: serviceTip('Redis', health.redis),
    },
    {
      key: 'workers',
      label: workersLabel(health.workers.length),
      state: health.workers.length > 0 ? 'ok' : 'down',
      tip: workersTip(health.workers),
    },
    llamaCppPart(health.llama_cpp),
  ]
}

function StatusPart({ part }: { part: Part }) {
  const tipId = useId()
  return (
    <li
      className="status-part"
      data-part={part.key}
      data-state={part.state}
      tabIndex={0}
      aria-describedby={tipId}
    >
      <span className={`dot dot--${part.state}`} aria-hidden="true" />
      <span className="status-part__label">{part.label}</span>
      <span className="visually-hidden">: {part.state}</span>
      <span role="tooltip" id={tipId} className="tooltip">
        {part.tip}
      </span>
    </li>
  )
}

/** Header widget: dots for database, Redis, workers and llama.cpp, then the overall status word. */
export function StatusIndicator({ state }: { state: HealthState }) {
  const label = healthLabel(state)
  return (
    <div className="status" role="group" aria-label="System status">
      <ul className="status-parts">
        {healthParts(state).map((part) => (
          <StatusPart key={part.key} part={part} />
        ))}
      </ul>
      <span className={`status-word status-word--${label}`} data-testid="health-status" data-state={label}>
        {label}
      </span>
    </div>
  )
}
