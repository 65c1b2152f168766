import { render, screen } from '@testing-library/react'
import { createMemoryRouter, RouterProvider } from 'react-router'
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import { routes } from './routes'
import { apiFetchMock, FakeSocket, jsonResponse } from './test/fixtures'

vi.mock('uplot', () => import('./test/uplotStub'))

function renderAt(path: string) {
  const router = createMemoryRouter(routes, { initialEntries: [path] })
  render(<RouterProvider router={router} />)
  return router
}

beforeEach(() => {
  FakeSocket.instances = []
  vi.stubGlobal('WebSocket', FakeSocket)
  vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockImplementation(apiFetchMock()))
})

afterEach(() => {
  vi.unstubAllGlobals()
})

describe('routes', () => {
  it('renders the queue with its empty state, the hardware panel and the polled status', async () => {
    renderAt('/')
    expect(await screen.findByRole('heading', { level: 1, name: 'Queue' })).toBeInTheDocument()
    expect(await screen.findByText('No jobs yet')).toBeInTheDocument()
    expect(await screen.findByText('NVIDIA H200', { exact: false })).toBeInTheDocument()
    expect(screen.getByTestId('health-status')).toHaveTextContent('ok')
    expect(fetch).toHaveBeenCalledWith('/api/health', expect.anything())
    expect(FakeSocket.instances.some((s) => s.url.endsWith('/ws/queue?after=%24'))).toBe(true)
  })

  it('has a navigation link for every section and the account menu', async () => {
    renderAt('/datasets')
    const nav = await screen.findByRole('navigation', { name: 'Main' })
    for (const name of ['Queue', 'New fine-tune', 'Datasets', 'Models', 'Artifacts', 'Compare']) {
      expect(nav).toContainElement(screen.getByRole('link', { name }))
    }
    expect(screen.getByRole('link', { name: 'Datasets' })).toHaveAttribute('aria-current', 'page')
    expect(await screen.findByRole('button', { name: /Ada/ })).toBeInTheDocument()
  })

  it.each([
    ['/jobs/new', 'New fine-tune'],
    ['/datasets', 'Datasets'],
    ['/models', 'Models'],
    ['/artifacts', 'Artifacts'],
    ['/compare', 'Compare'],
    ['/account/tokens', 'API tokens'],
    ['/account/notifications', 'Notifications'],
    ['/setup', 'Set up Lanner'],
    ['/signin', 'Sign in'],
    ['/no/such/page', 'Page not found'],
  ])('%s shows "%s"', async (path, heading) => {
    renderAt(path)
    expect(await screen.findByRole('heading', { level: 1, name: heading })).toBeInTheDocument()
  })

  it('sends the browser to first-run setup when no user exists', async () => {
    vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockImplementation(apiFetchMock({ '/api/setup': { needed: true } })))
    const router = renderAt('/datasets')
    expect(await screen.findByRole('heading', { level: 1, name: 'Set up Lanner' })).toBeInTheDocument()
    expect(router.state.location.pathname).toBe('/setup')
  })

  it('sends the browser to sign-in, remembering the page, when the session is gone', async () => {
    const base = apiFetchMock()
    vi.stubGlobal(
      'fetch',
      vi.fn<typeof fetch>().mockImplementation(async (input) =>
        String(input).startsWith('/api/me') ? jsonResponse({ detail: 'Sign in first' }, 401) : base(input),
      ),
    )
    const router = renderAt('/datasets')
    expect(await screen.findByRole('heading', { level: 1, name: 'Sign in' })).toBeInTheDocument()
    expect(router.state.location.pathname).toBe('/signin')
    expect(router.state.location.search).toBe('?next=%2Fdatasets')
  })

  it('puts the charts on the job page and replays its stream from the start', async () => {
    renderAt('/jobs/42')
    expect(await screen.findByRole('figure', { name: 'Loss' })).toBeInTheDocument()
    expect(screen.getByRole('figure', { name: 'Tokens per second' })).toBeInTheDocument()
    expect(screen.getAllByText('Waiting for data')).toHaveLength(6)
    // The stream opens in an effect after the page's first render: wait for it rather than race it.
    await vi.waitFor(() => expect(FakeSocket.instances.some((s) => s.url.endsWith('/ws/jobs/42?after=0-0'))).toBe(true))
  })

  it('says on the job page that the job was queued again after its worker was lost, and from where', async () => {
    const requeued = {
      id: 42, owner_id: 1, kind: 'train', name: 'lora run', method: 'lora', model: 'builtin/SmolLM2-135M-Instruct',
      dataset_id: 1, parent_job_id: null, config: {}, status: 'running', priority: 0, memory_estimate_bytes: null,
      gpus: 0, worker: 'cpu0@box', device: null, step: 5, total_steps: 8, error: null, resume_from: 'checkpoint-4',
      requeues: 2, created_at: '2026-11-29T12:00:00Z', started_at: '2026-11-29T12:01:00Z', finished_at: null,
      queue_position: null, estimated_start: null, cancel_requested: false,
    }
    vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockImplementation(apiFetchMock({ '/api/jobs/42': requeued })))
    renderAt('/jobs/42')
    expect(await screen.findByTestId('requeues')).toHaveTextContent(
      'Its worker was lost: queued again 2 times, to resume from checkpoint-4.')
  })

  it.each([[8, true], [0, false]])('the new-job form offers the LoRA targets choice when the model has experts (%s experts)', async (experts, shown) => {
    const estimate = { model: 'builtin/SmolLM2-135M-Instruct', device: 'cpu', estimate: { total_bytes: 2 ** 30, parameters: 1000, experts } }
    vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockImplementation(apiFetchMock({ '/api/jobs/estimate': estimate })))
    renderAt('/jobs/new')
    expect(await screen.findByTestId('estimate-total')).toBeInTheDocument()
    const choice = screen.queryByRole('combobox', { name: /LoRA targets/ })
    if (!shown) return expect(choice).toBeNull()
    expect(choice).toHaveValue('all')
    expect([...(choice as HTMLSelectElement).options].map((o) => o.value)).toEqual(['attention', 'experts', 'all'])
  })
})
