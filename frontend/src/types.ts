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

// ---- Accounts -------------------------------------------------------------

export type Role = 'admin' | 'member'

export interface User {
  id: number
  email: string
  display_name: string
  role: Role
  is_active: boolean
  created_at: string
}

export interface ApiToken {
  id: number
  name: string
  prefix: string
  created_at: string
  last_used_at: string | null
  revoked_at: string | null
}

/** POST /api/tokens answers with the token itself, once. */
export interface CreatedToken extends ApiToken {
  token: string
}

// ---- Jobs -----------------------------------------------------------------

export type JobStatus = 'queued' | 'running' | 'succeeded' | 'failed' | 'cancelled'

export type Method = 'lora' | 'qlora' | 'full' | 'pretrain' | 'dpo' | 'orpo' | 'kto'

export interface Job {
  id: number
  owner_id: number
  kind: string
  name: string
  method: string
  model: string
  dataset_id: number | null
  parent_job_id: number | null
  config: Record<string, unknown>
  status: JobStatus
  priority: number
  memory_estimate_bytes: number | null
  gpus: number
  worker: string | null
  device: { kind?: string; name?: string; index?: number | null; memory_total_bytes?: number | null } | null
  step: number
  total_steps: number | null
  error: string | null
  resume_from: string | null
  created_at: string
  started_at: string | null
  finished_at: string | null
  queue_position: number | null
  estimated_start: string | null
  cancel_requested: boolean
}

export interface Page<T> {
  items: T[]
  total: number
  offset: number
  limit: number
}

export interface QueueSnapshot {
  running: Job[]
  queued: Job[]
}

// ---- Datasets, models, artifacts -----------------------------------------

export interface BadRow {
  line: number
  reason: string
}

export interface DatasetReport {
  format?: string | null
  task?: string | null
  file_format?: string
  rows?: number
  usable_rows?: number
  bad_rows?: BadRow[]
  bad_row_count?: number
  columns?: string[]
  error?: string
}

export interface Dataset {
  id: number
  owner_id: number
  name: string
  filename: string
  size_bytes: number
  format: string | null
  rows: number
  usable_rows: number
  report: DatasetReport
  created_at: string
}

export interface CatalogModel {
  id: string
  family: string | null
  name: string | null
  parameters: number | null
  gated: boolean
  source: 'builtin' | 'hub' | 'local' | string
}

export interface Catalog {
  default: CatalogModel
  curated: CatalogModel[]
  local: CatalogModel[]
}

export interface Artifact {
  id: number
  job_id: number
  kind: string
  name: string
  size_bytes: number
  verification: Record<string, unknown> | null
  created_at: string
  files: string[] | null
}

/** One message of a WebSocket stream: {"id": stream id, "type": …, "data": …}. */
export interface StreamEvent {
  id: string
  type: string
  data: Record<string, unknown>
}

// ---- History, estimates, previews, exports, evaluations -------------------

/** GET /api/jobs/{id}/metrics: one saved step (eval rows carry only eval_* values). */
export interface MetricRow {
  step: number
  time: string
  values: Record<string, unknown>
}

/** GET /api/jobs/{id}/device-samples: one saved device sample. */
export interface SampleRow {
  id: number
  time: string
  values: Record<string, unknown>
}

/** POST /api/jobs/estimate: bytes by part and total_bytes; null for a model of unknown size. */
export interface MemoryEstimate {
  model: string
  device: 'cuda' | 'cpu' | string
  estimate: (Record<string, number> & { total_bytes: number }) | null
}

/** GET /api/datasets/{id}/preview: one rendered sequence, as segments trained or not. */
export interface PreviewSequence {
  row: number
  sequence: string
  tokens: number
  trained_tokens: number
  truncated: boolean
  segments: { text: string; trained: boolean }[]
}

export interface DatasetPreview {
  model: string
  task: string
  rows: PreviewSequence[]
}

/** GET /api/datasets/{id}/token-stats. `lengths` (sorted) is there when the server sends it. */
export interface TokenStats {
  model: string
  task: string
  rows_measured: number
  rows_total?: number
  sequences: number
  min?: number
  max?: number
  mean?: number
  p50?: number
  p95?: number
  total_tokens?: number
  trained_tokens?: number
  max_seq_len?: number
  over_max_seq_len?: number
  lengths?: number[]
}

/** GET /api/models/search: a model on the hub. */
export interface HubModel {
  id: string
  downloads: number | null
  likes: number | null
}

/** The body of POST /api/jobs/{id}/export. */
export interface ExportOptions {
  adapter: boolean
  merged: boolean
  merged_dtype: 'bfloat16' | 'float16'
  gguf_types: string[]
  verify: boolean
}

/** GET /api/jobs/{id}/evaluation: the trained model against its base on held-out prompts. */
export interface EvaluationSample {
  prompt: string
  reference: string
  base_answer: string
  tuned_answer: string
  base_overlap: number
  tuned_overlap: number
}

export interface Evaluation {
  status: 'done' | 'running' | 'failed'
  error: string | null
  base_eval_loss: number | null
  tuned_eval_loss: number | null
  samples: EvaluationSample[]
  scores: { base_overlap: number; tuned_overlap: number } | null
}
