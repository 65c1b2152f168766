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
    ...overrides,
  }
}

export function jsonResponse(body: unknown, status = 200, statusText = ''): Response {
  return new Response(JSON.stringify(body), {
    status,
    statusText,
    headers: { 'Content-Type': 'application/json' },
  })
}
