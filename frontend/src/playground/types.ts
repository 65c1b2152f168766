// Shapes of the playground's API (lanner.backend.routers.playground), by the names the page uses: each is a
// schema of the API's OpenAPI document, socket messages included (backend/openapi_document.py).
import type { components } from '../api/schema'
import type { Job } from '../types'

type Schemas = components['schemas']

export type Side = Schemas['SocketToken']['model']

/** One side of a chat: the GGUF that answers, or why there is none (`code`, `reason`). */
export type ModelFile = Schemas['ModelFileOut']

/** GET /api/playground/jobs (a list of these) and /api/playground/jobs/{id}. */
export type PlaygroundJob = Schemas['PlaygroundJobOut']

export interface Sampling {
  temperature: number
  top_p: number
  max_tokens: number
  /** Stop strings, one per line in the form. */
  stop: string[]
}

export type ChatMessage = Schemas['Message']

/** What /ws/playground is asked: an answer, or to stop the answers coming. */
export type PlaygroundRequest = Schemas['GenerateRequest'] | Schemas['StopAnswers']

/** What /ws/playground sends. */
export type ServerMessage =
  | Schemas['SocketStatus']
  | Schemas['SocketToken']
  | Schemas['SocketDone']
  | Schemas['SocketError']

/** Where the answers come from: the CPU (GGUF through llama.cpp) or a GPU session (a queued job). */
export type Where = 'cpu' | 'gpu'

/** The parts of a GPU session's job (POST /api/playground/jobs/{id}/gpu-session, GET /api/jobs/{id}) shown here. */
export type GpuSession = Pick<Job, 'id' | 'status' | 'queue_position' | 'device' | 'error'>
