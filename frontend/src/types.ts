// Shapes of the backend's JSON responses. Keep in step with lanner.backend's pydantic schemas.

/** Overall system state as reported by GET /api/health. */
export type HealthStatus = 'ok' | 'degraded'

/** One dependency of the backend (database, Redis). */
export interface ServiceHealth {
  ok: boolean
  /** Connection URL with any password already redacted by the server. */
  url: string
  /** Why the check failed; null when ok. */
  detail: string | null
}

export type DeviceKind = 'cpu' | 'cuda'

export interface WorkerDevice {
  kind: DeviceKind
  name: string
  memory_total_bytes: number | null
  index: number | null
}

/** A Celery worker that answered the last health ping. */
export interface WorkerInfo {
  name: string
  device: WorkerDevice
  /** ISO 8601 time of the worker's last heartbeat. */
  last_seen: string
}

export interface Health {
  status: HealthStatus
  version: string
  database: ServiceHealth
  redis: ServiceHealth
  workers: WorkerInfo[]
}
