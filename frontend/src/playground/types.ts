// Shapes of the playground's API (lanner.backend.routers.playground). Those the OpenAPI document does not
// describe yet (the playground's job list answers untyped dicts; what the socket sends back is no model)
// are written by hand here.
import type { components } from '../api/schema'
import type { Job } from '../types'

export type Side = 'tuned' | 'base'

/** One side of a chat: the GGUF that answers, or why there is none (`code`, `reason`). */
export interface ModelFile {
  available: boolean
  gguf: string | null
  artifact_id: number | null
  size_bytes: number | null
  code: string | null
  reason: string | null
}

/** GET /api/playground/jobs (a list of these) and /api/playground/jobs/{id}. */
export interface PlaygroundJob {
  job_id: number
  name: string
  model: string
  status: string
  finished_at: string | null
  custom_chat_template: boolean
  tuned: ModelFile
  base: ModelFile
  export_url: string
  pending_export: { job_id: number; status: string } | null
}

export interface Sampling {
  temperature: number
  top_p: number
  max_tokens: number
  /** Stop strings, one per line in the form. */
  stop: string[]
}

export type ChatMessage = components['schemas']['Message']

/** What /ws/playground is asked: an answer, or to stop the answers coming. */
export type PlaygroundRequest = components['schemas']['GenerateRequest'] | { type: 'stop' }

/** What /ws/playground sends. */
export type ServerMessage =
  | {
      type: 'status'
      id: unknown
      model: Side
      state: 'queued' | 'loading' | 'waiting' | 'generating'
      /** With `queued`: the GPU session's place in the queue (1 runs next). */
      queue_position?: number | null
    }
  | { type: 'token'; id: unknown; model: Side; text: string }
  | { type: 'done'; id: unknown; model: Side; finish_reason: string; chunks: number; seconds: number }
  | { type: 'error'; id: unknown; model: Side | null; code: string; message: string; export_url?: string }

/** Where the answers come from: the CPU (GGUF through llama.cpp) or a GPU session (a queued job). */
export type Where = 'cpu' | 'gpu'

/** The parts of a GPU session's job (POST /api/playground/jobs/{id}/gpu-session, GET /api/jobs/{id}) shown here. */
export type GpuSession = Pick<Job, 'id' | 'status' | 'queue_position' | 'device' | 'error'>
