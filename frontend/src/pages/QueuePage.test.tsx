import { act, render, screen, within } from '@testing-library/react'
import { createMemoryRouter, RouterProvider } from 'react-router'
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import { routes } from '../routes'
import { deviceLabel } from './QueuePage'
import { apiFetchMock, FakeSocket, userFixture } from '../test/fixtures'
import type { Job, Sweep } from '../types'

vi.mock('uplot', () => ({ default: class {} }))

function job(overrides: Partial<Job>): Job {
  return {
    id: 1, owner_id: 1, kind: 'train', name: 'lora run', method: 'lora', model: 'builtin/SmolLM2-135M-Instruct',
    dataset_id: 1, parent_job_id: null, sweep_id: null, config: {}, status: 'queued', priority: 0, memory_estimate_bytes: null,
    gpus: 0, worker: null, device: null, step: 0, total_steps: null, error: null, resume_from: null, requeues: 0,
    created_at: '2026-11-29T12:00:00Z', started_at: null, finished_at: null, queue_position: 1,
    estimated_start: null, cancel_requested: false, ...overrides,
  }
}

let queue: { running: Job[]; queued: Job[] }
let sweeps: Sweep[]

beforeEach(() => {
  FakeSocket.instances = []
  queue = { running: [], queued: [] }
  sweeps = []
  vi.stubGlobal('WebSocket', FakeSocket)
  const base = apiFetchMock()
  vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockImplementation(async (input, init) => {
    if (String(input) === '/api/queue') return new Response(JSON.stringify(queue), { status: 200 })
    if (String(input).startsWith('/api/sweeps?')) return new Response(JSON.stringify({ items: sweeps, total: sweeps.length, offset: 0, limit: 10 }), { status: 200 })
    void init
    return base(input as string)
  }))
})

afterEach(() => {
  vi.unstubAllGlobals()
})

describe('QueuePage', () => {
  it('says why a queued job waits', async () => {
    queue = { running: [], queued: [job({ id: 9, name: 'big run', gpus: 4, error: 'Waiting: needs 4 GPUs, the largest machine has 2.' })] }
    render(<RouterProvider router={createMemoryRouter(routes, { initialEntries: ['/'] })} />)
    const queued = await screen.findByTestId('queued-jobs')
    expect(within(queued).getByText('Waiting: needs 4 GPUs, the largest machine has 2.')).toBeInTheDocument()
  })

  it('lists the recent sweeps with their runs and status', async () => {
    sweeps = [{ id: 4, owner_id: 1, name: 'rates', status: 'running', strategy: 'grid', budget: 4, seed: 0, metric: 'loss',
      direction: 'minimize', parameters: [{ field: 'hyperparameters.learning_rate', values: [1e-4, 1e-3], low: null, high: null, log: false }],
      base: {}, job_ids: [1, 2], runs_by_status: { succeeded: 1, queued: 1 }, created_at: '2026-11-29T12:00:00Z', cancelled_at: null }]
    render(<RouterProvider router={createMemoryRouter(routes, { initialEntries: ['/'] })} />)
    const table = await screen.findByTestId('sweeps')
    expect(within(table).getByRole('link', { name: 'rates' })).toHaveAttribute('href', '/sweeps/4')
    expect(within(table).getByText('1 succeeded, 1 queued')).toBeInTheDocument()
    expect(within(table).getByText('grid · learning_rate · by loss')).toBeInTheDocument()
    expect(within(table).getByTestId('sweep-status-4')).toHaveTextContent('running')
  })

  it('shows a job added by someone else as soon as the queue stream says so, then its live metrics', async () => {
    render(<RouterProvider router={createMemoryRouter(routes, { initialEntries: ['/'] })} />)
    expect(await screen.findByText('No jobs yet')).toBeInTheDocument()
    const queueSocket = FakeSocket.instances.find((s) => s.url.includes('/ws/queue'))!

    queue = { running: [], queued: [job({ id: 5, name: 'second run' })] }
    await act(async () => {
      queueSocket.receive({ id: '1-0', type: 'added', data: { job_id: 5 } })
    })
    const queued = await screen.findByTestId('queued-jobs')
    expect(within(queued).getByText('second run')).toBeInTheDocument()
    expect(within(queued).getByRole('button', { name: 'Move job 5 up' })).toBeDisabled()
    expect(within(queued).getByRole('button', { name: 'Cancel job 5' })).toBeEnabled()

    queue = { running: [job({ id: 5, name: 'second run', status: 'running', started_at: '2026-11-29T12:00:00Z', device: { kind: 'cpu' } })], queued: [] }
    await act(async () => {
      queueSocket.receive({ id: '2-0', type: 'started', data: { job_id: 5 } })
    })
    const running = await screen.findByTestId('running-jobs')
    expect(within(running).getByText('Ada (you)')).toBeInTheDocument()
    const jobSocket = await vi.waitFor(() => {
      const found = FakeSocket.instances.find((s) => s.url.includes('/ws/jobs/5?after=%24'))
      if (!found) throw new Error('no job socket yet')
      return found
    })
    await act(async () => {
      jobSocket.receive({ id: '3-0', type: 'metric', data: { step: 3, total_steps: 10, loss: 2, tokens_per_second: 1234.5, step_time: 2 } })
      await new Promise((r) => setTimeout(r, 80))
    })
    expect(within(running).getByText('1,235')).toBeInTheDocument()
    expect(within(running).getByText('3/10')).toBeInTheDocument()
    expect(within(running).getByText('14 s')).toBeInTheDocument() // 7 steps left at 2 s a step
    expect(userFixture.id).toBe(1)
  })
})

describe('deviceLabel', () => {
  it('names the device and the worker host a job runs on', () => {
    const device = { kind: 'cuda', index: 1, name: 'NVIDIA H200', memory_total_bytes: 1, host: 'box2' }
    expect(deviceLabel(job({ status: 'running', device }))).toBe('cuda:1 · NVIDIA H200 on box2')
    expect(deviceLabel(job({ status: 'running', device: { kind: 'cpu', host: 'box3' } }))).toBe('cpu on box3')
    expect(deviceLabel(job({ status: 'running', device: { kind: 'cpu' } }))).toBe('cpu')
  })
})
