import { fireEvent, render, screen, waitFor, within } from '@testing-library/react'
import { createMemoryRouter, RouterProvider } from 'react-router'
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import { routes } from '../routes'
import { apiFetchMock, FakeSocket, jsonResponse } from '../test/fixtures'
import type { RankedRun, Sweep, SweepRanking } from '../types'

vi.mock('uplot', () => import('../test/uplotStub'))

const sweep: Sweep = {
  id: 3, owner_id: 1, name: 'rates', status: 'succeeded', strategy: 'grid', budget: 2, seed: 0, metric: 'loss', direction: 'minimize',
  parameters: [{ field: 'hyperparameters.learning_rate', values: [1e-4, 1e-3], low: null, high: null, log: false }],
  base: {}, job_ids: [7, 8], runs_by_status: { succeeded: 2 }, created_at: '2026-12-02T12:00:00Z', cancelled_at: null,
}
const run = (jobId: number, rate: number, value: number, rank: number, best: boolean): RankedRun => ({
  job_id: jobId, name: `rates #${jobId}`, status: 'succeeded', values: { 'hyperparameters.learning_rate': rate }, value, rank, best,
})
const byLoss: SweepRanking = { metric: 'loss', direction: 'minimize', metrics: ['grad_norm', 'loss'], runs: [run(8, 1e-3, 1.25, 1, true), run(7, 1e-4, 2.5, 2, false)] }
const byNorm = { ...byLoss, metric: 'grad_norm', runs: [run(7, 1e-4, 3, 1, true), run(8, 1e-3, 2, 2, false)] }

let requested: string[]
let current: Sweep
let ranked: SweepRanking

beforeEach(() => {
  requested = []
  current = sweep
  ranked = byLoss
  FakeSocket.instances = []
  vi.stubGlobal('WebSocket', FakeSocket)
  const base = apiFetchMock({ '/api/jobs/7/metrics': [], '/api/jobs/8/metrics': [] })
  vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockImplementation(async (input) => {
    const url = String(input)
    requested.push(url)
    if (url === '/api/sweeps/3' || url === '/api/sweeps/3/cancel') return jsonResponse(current)
    if (url.startsWith('/api/sweeps/3/ranking')) return jsonResponse(url.includes('metric=grad_norm') ? byNorm : ranked)
    return base(url)
  }))
})

afterEach(() => {
  vi.unstubAllGlobals()
})

describe('SweepPage', () => {
  it('ranks the runs with the best marked, and ranks again by another metric they logged', async () => {
    render(<RouterProvider router={createMemoryRouter(routes, { initialEntries: ['/sweeps/3'] })} />)
    const table = await screen.findByTestId('sweep-ranking')
    const rows = within(table).getAllByRole('row').slice(1)
    expect(rows.map((row) => row.getAttribute('data-best'))).toEqual(['true', null])
    expect(within(rows[0]!).getByText('#8')).toBeInTheDocument()
    expect(within(rows[0]!).getByText(/best/)).toBeInTheDocument()
    expect(screen.getByTestId('sweep-status')).toHaveTextContent('succeeded')
    expect(screen.queryByRole('button', { name: 'Cancel sweep' })).not.toBeInTheDocument() // it has ended

    fireEvent.change(screen.getByLabelText('Rank by'), { target: { value: 'grad_norm' } })
    await waitFor(() => expect(within(screen.getByTestId('sweep-ranking')).getAllByRole('row')[1]).toHaveTextContent('#7'))
    expect(requested).toContain('/api/sweeps/3/ranking?metric=grad_norm')
  })

  it('cancels a running sweep, and reads a finished run\'s history once', async () => {
    current = { ...sweep, status: 'running', runs_by_status: { succeeded: 1, running: 1 } }
    ranked = { ...byLoss, runs: [run(7, 1e-4, 2.5, 1, true), { ...run(8, 1e-3, 3, 2, false), status: 'running' }] }
    vi.stubGlobal('confirm', () => true)
    render(<RouterProvider router={createMemoryRouter(routes, { initialEntries: ['/sweeps/3'] })} />)
    const cancel = await screen.findByRole('button', { name: 'Cancel sweep' })
    await waitFor(() => expect(requested.filter((url) => url.startsWith('/api/jobs/8/metrics'))).toHaveLength(1))
    current = { ...current, cancelled_at: '2026-12-02T12:10:00Z' }
    fireEvent.click(cancel)
    expect(await screen.findByText(/Cancelled: its queued runs will not run/)).toBeInTheDocument()
    await waitFor(() => expect(requested.filter((url) => url.startsWith('/api/jobs/8/metrics'))).toHaveLength(2))
    expect(requested.filter((url) => url.startsWith('/api/jobs/7/metrics'))).toHaveLength(1)
    expect(requested).toContain('/api/sweeps/3/cancel')
  })
})
