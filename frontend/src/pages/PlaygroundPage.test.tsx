import { act, fireEvent, render, screen, within } from '@testing-library/react'
import { createMemoryRouter, RouterProvider } from 'react-router'
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import type { GpuSession, PlaygroundJob } from '../playground/types'
import { routes } from '../routes'
import { apiFetchMock, FakeSocket, healthFixture, jsonResponse, llamaCppBuilding } from '../test/fixtures'

vi.mock('uplot', () => ({ default: class {} }))

/** FakeSocket that is open at once and keeps what the page sends. */
class ChatSocket extends FakeSocket {
  static OPEN = 1
  readyState = 1
  sent: Record<string, unknown>[] = []
  send(text: string) {
    this.sent.push(JSON.parse(text) as Record<string, unknown>)
  }
  addEventListener() {}
}

const playgroundJob: PlaygroundJob = {
  job_id: 7, name: 'lora run', model: 'builtin/SmolLM2-135M-Instruct', status: 'succeeded', finished_at: null,
  custom_chat_template: false, export_url: '/api/jobs/7/export', pending_export: null,
  tuned: { available: false, gguf: null, artifact_id: null, size_bytes: null, code: 'not_exported', reason: 'Job 7 has no GGUF yet' },
  base: { available: true, gguf: 'SmolLM2.gguf', artifact_id: null, size_bytes: 1, code: null, reason: null },
}
const queued: GpuSession = { id: 31, status: 'queued', queue_position: 2, device: null, error: null }
let posts: string[]

beforeEach(() => {
  FakeSocket.instances = []
  posts = []
  vi.stubGlobal('WebSocket', ChatSocket)
  const base = apiFetchMock({ '/api/playground/jobs': [playgroundJob] })
  vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockImplementation(async (input, init) => {
    const path = String(input)
    if (init?.method === 'POST') {
      posts.push(path)
      if (path === '/api/playground/jobs/7/gpu-session') return jsonResponse(queued, 201)
      if (path === '/api/playground/gpu-sessions/31/close') return jsonResponse({ ...queued, status: 'cancelled' })
    }
    return base(path)
  }))
})

afterEach(() => {
  vi.unstubAllGlobals()
})

describe('PlaygroundPage on a GPU', () => {
  it('queues a GPU session, shows its place in the queue, sends the questions to it and ends it', async () => {
    render(<RouterProvider router={createMemoryRouter(routes, { initialEntries: ['/playground?job=7'] })} />)
    const gpu = await screen.findByRole('radio', { name: 'Run on GPU (queued)' })
    const send = screen.getByRole('button', { name: 'Send' })
    fireEvent.change(screen.getByLabelText('Your message'), { target: { value: 'Hi?' } })
    expect(send).toBeDisabled() // on the CPU the fine-tuned side has no GGUF yet

    fireEvent.click(gpu)
    expect(await screen.findByTestId('gpu-session')).toHaveTextContent('Waiting for a GPU: number 2 in the queue (job 31)')
    expect(posts).toEqual(['/api/playground/jobs/7/gpu-session'])
    expect(send).toBeEnabled() // a GPU session needs no GGUF
    fireEvent.click(send)
    const socket = FakeSocket.instances.find((s) => s.url.includes('/ws/playground')) as ChatSocket
    const asked = socket.sent.at(-1)!
    expect(asked).toMatchObject({ type: 'generate', job_id: 7, gpu_session: 31, chats: { tuned: [{ role: 'user', content: 'Hi?' }] } })

    const column = screen.getByTestId('chat-tuned')
    expect(within(column).getByText('GPU session (job 31)')).toBeInTheDocument()
    await act(async () => {
      socket.receive({ type: 'status', id: asked.id, model: 'tuned', state: 'queued', queue_position: 1, gpu_session: 31 })
    })
    expect(within(column).getByTestId('activity-tuned')).toHaveTextContent('Waiting for a GPU: number 1 in the queue…')
    await act(async () => {
      socket.receive({ type: 'status', id: asked.id, model: 'tuned', state: 'generating' })
      socket.receive({ type: 'token', id: asked.id, model: 'tuned', text: 'Hello' })
      socket.receive({ type: 'done', id: asked.id, model: 'tuned', finish_reason: 'stop', chunks: 1, seconds: 0.2 })
    })
    expect(within(column).getByTestId('answer-tuned')).toHaveTextContent('Hello')

    fireEvent.click(screen.getByRole('button', { name: 'End GPU session' }))
    await vi.waitFor(() => expect(posts).toContain('/api/playground/gpu-sessions/31/close'))
    expect(screen.getByRole('radio', { name: 'CPU (GGUF, llama.cpp)' })).toBeChecked()
    expect(screen.queryByTestId('gpu-session')).not.toBeInTheDocument()
  })
})

describe('PlaygroundPage on the CPU', () => {
  it('says chat waits for llama.cpp while it is built, and sends nothing', async () => {
    const exported = { ...playgroundJob, tuned: { ...playgroundJob.base, gguf: 'run-q8_0.gguf' } }
    vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockImplementation(apiFetchMock({
      '/api/playground/jobs': [exported], '/api/health': healthFixture({ llama_cpp: llamaCppBuilding }),
    })))
    render(<RouterProvider router={createMemoryRouter(routes, { initialEntries: ['/playground?job=7'] })} />)
    expect(await screen.findByTestId('llama-cpp-notice')).toHaveTextContent(
      'Chat on the CPU needs llama.cppllama.cpp is still being built (since 11:20 UTC); ready in a few minutes.')
    fireEvent.change(screen.getByLabelText('Your message'), { target: { value: 'Hi?' } })
    expect(screen.getByRole('button', { name: 'Send' })).toBeDisabled()
  })
})
