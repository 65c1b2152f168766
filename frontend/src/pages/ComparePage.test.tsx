import { render, screen, within } from '@testing-library/react'
import { createMemoryRouter, RouterProvider } from 'react-router'
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import { routes } from '../routes'
import { apiFetchMock, FakeSocket } from '../test/fixtures'

vi.mock('uplot', () => import('../test/uplotStub'))

function job(id: number, learningRate: number) {
  return {
    id, owner_id: 1, kind: 'train', name: `run ${id}`, method: 'lora', model: 'builtin/SmolLM2-135M-Instruct', dataset_id: 1,
    parent_job_id: null, status: 'succeeded', priority: 0, memory_estimate_bytes: null, gpus: 0, worker: null, device: null,
    step: 2, total_steps: 2, error: null, resume_from: null, requeues: 0, created_at: '2026-11-29T12:00:00Z', started_at: null,
    finished_at: '2026-11-29T12:05:00Z', queue_position: null, estimated_start: null, cancel_requested: false,
    config: { method: 'lora', model: 'builtin/SmolLM2-135M-Instruct', dataset_id: 1, gpus: 0, hyperparameters: { learning_rate: learningRate, epochs: 1 } },
  }
}

const metrics = (loss: number) => [
  { step: 1, time: '2026-11-29T12:01:00Z', values: { loss, learning_rate: 2e-4 } },
  { step: 2, time: '2026-11-29T12:02:00Z', values: { loss: loss - 0.5, learning_rate: 1e-4 } },
]

beforeEach(() => {
  FakeSocket.instances = []
  vi.stubGlobal('WebSocket', FakeSocket)
  vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockImplementation(apiFetchMock({
    '/api/jobs': { items: [job(2, 1e-4), job(1, 2e-4)], total: 2, offset: 0, limit: 50 },
    '/api/jobs/1': job(1, 2e-4),
    '/api/jobs/2': job(2, 1e-4),
    '/api/jobs/1/metrics': metrics(3),
    '/api/jobs/2/metrics': metrics(2.8),
    '/api/jobs/1/evaluation': {
      status: 'done', error: null, base_eval_loss: 2.0, tuned_eval_loss: 1.5, samples: [],
      scores: { base_overlap: 0.2, tuned_overlap: 0.6 },
    },
  })))
})

afterEach(() => {
  vi.unstubAllGlobals()
})

describe('ComparePage', () => {
  it('overlays the chosen runs, sets their settings side by side with the differences marked, and their evaluations', async () => {
    const router = createMemoryRouter(routes, { initialEntries: ['/compare?jobs=1,2'] })
    render(<RouterProvider router={router} />)
    const settings = await screen.findByTestId('compare-settings')
    const lr = within(settings).getByRole('row', { name: /hyperparameters\.learning_rate/ })
    expect(lr).toHaveAttribute('data-differs', 'true')
    expect(lr).toHaveTextContent('0.0002')
    expect(lr).toHaveTextContent('0.0001')
    expect(within(settings).getByRole('row', { name: /hyperparameters\.epochs/ })).not.toHaveAttribute('data-differs')
    expect(screen.getByTestId('compare-loss')).toHaveAttribute('data-points', '2')

    const evaluations = screen.getByTestId('compare-evaluations')
    expect(within(evaluations).getByRole('row', { name: /Eval loss change/ })).toHaveTextContent('−25.0 %')
    expect(within(evaluations).getByRole('row', { name: /Eval loss, base/ })).toHaveTextContent('none') // run 2 has none (404)

    expect(screen.getByRole('checkbox', { name: 'Compare job 1' })).toBeChecked()
    screen.getByRole('checkbox', { name: 'Compare job 2' }).click()
    await vi.waitFor(() => expect(router.state.location.search).toBe('?jobs=1'))
  })
})
