import type { Health } from '../types'

const GIB = 1024 ** 3

export function healthFixture(overrides: Partial<Health> = {}): Health {
  return {
    status: 'ok',
    version: '0.1.0',
    database: { ok: true, url: 'sqlite:///data/lanner.db', detail: null },
    redis: { ok: true, url: 'redis://127.0.0.1:6379/0', detail: null },
    workers: [
      {
        name: 'gpu0@box',
        device: { kind: 'cuda', name: 'NVIDIA H200', memory_total_bytes: 141 * GIB, index: 0 },
        last_seen: '2026-11-29T12:00:00Z',
      },
      {
        name: 'cpu0@box',
        device: { kind: 'cpu', name: 'x86_64', memory_total_bytes: 24 * GIB, index: 0 },
        last_seen: '2026-11-29T12:00:00Z',
      },
    ],
    llama_cpp: { state: 'ready', detail: 'llama.cpp is ready.', since: null, log: null },
    ...overrides,
  }
}

/** llama.cpp as /api/health reports it while `./lanner up` builds it in the background. */
export const llamaCppBuilding = {
  state: 'building' as const,
  detail: 'llama.cpp is still being built (since 11:20 UTC); ready in a few minutes.',
  since: '2026-12-02T11:20:00Z',
  log: '/srv/lanner/data/logs/llama-cpp-build.log',
}

export function jsonResponse(body: unknown, status = 200, statusText = ''): Response {
  return new Response(JSON.stringify(body), {
    status,
    statusText,
    headers: { 'Content-Type': 'application/json' },
  })
}

export const userFixture = {
  id: 1,
  email: 'ada@example.com',
  display_name: 'Ada',
  role: 'admin' as const,
  is_active: true,
  created_at: '2026-11-29T12:00:00Z',
}

/** A fake WebSocket the tests drive by hand: `FakeSocket.last.receive({...})`, `.drop()`. */
export class FakeSocket {
  static instances: FakeSocket[] = []
  static get last(): FakeSocket {
    return FakeSocket.instances[FakeSocket.instances.length - 1]!
  }
  url: string
  onopen: (() => void) | null = null
  onmessage: ((event: { data: string }) => void) | null = null
  onclose: ((event: { code: number; reason: string }) => void) | null = null
  closed = false
  constructor(url: string) {
    this.url = url
    FakeSocket.instances.push(this)
  }
  open() {
    this.onopen?.()
  }
  receive(event: unknown) {
    this.onmessage?.({ data: JSON.stringify(event) })
  }
  drop(code = 1006, reason = '') {
    this.onclose?.({ code, reason })
  }
  close() {
    this.closed = true
  }
}

/** fetch() answering like the API of an empty, signed-in studio. */
export function apiFetchMock(overrides: Record<string, unknown> = {}) {
  return async (input: RequestInfo | URL) => {
    const url = typeof input === 'string' ? input : input instanceof URL ? input.href : input.url
    const path = url.split('?')[0]!
    if (path in overrides) return jsonResponse(overrides[path])
    const answers: Record<string, unknown> = {
      '/api/health': healthFixture(),
      '/api/setup': { needed: false },
      '/api/me': userFixture,
      '/api/users': [userFixture],
      '/api/queue': { running: [], queued: [] },
      '/api/jobs': { items: [], total: 0, offset: 0, limit: 50 },
      '/api/sweeps': { items: [], total: 0, offset: 0, limit: 10 },
      '/api/datasets': { items: [], total: 0, offset: 0, limit: 200 },
      '/api/tokens': [],
      '/api/webhooks': [],
      '/api/me/notifications': { enabled: false, available: false, address: 'ada@example.com' },
      '/api/trackers': [
        { name: 'mlflow', label: 'MLflow', available: false, detail: 'MLflow is not set up on this studio' },
        { name: 'tensorboard', label: 'TensorBoard', available: true, detail: 'Event files' },
        { name: 'wandb', label: 'Weights & Biases', available: true, detail: 'An offline run' },
      ],
      '/api/models': {
        default: { id: 'builtin/SmolLM2-135M-Instruct', family: 'SmolLM2', name: 'SmolLM2-135M-Instruct', parameters: 134515008, gated: false, source: 'builtin' },
        curated: [],
        local: [],
      },
    }
    if (path in answers) return jsonResponse(answers[path])
    if (/^\/api\/jobs\/\d+\/(artifacts|trackers)$/.test(path)) return jsonResponse([])
    if (/^\/api\/jobs\/\d+$/.test(path)) return jsonResponse({ detail: 'No job' }, 404, 'Not Found')
    return jsonResponse({ detail: `no mock for ${path}` }, 404, 'Not Found')
  }
}
