import { render, screen } from '@testing-library/react'
import { createMemoryRouter, RouterProvider } from 'react-router'
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import { routes } from './routes'
import { healthFixture, jsonResponse } from './test/fixtures'

// uPlot draws on a canvas, which jsdom does not implement.
vi.mock('uplot', () => ({
  default: class {
    setData() {}
    setSize() {}
    destroy() {}
  },
}))

function renderAt(path: string) {
  const router = createMemoryRouter(routes, { initialEntries: [path] })
  return render(<RouterProvider router={router} />)
}

beforeEach(() => {
  vi.stubGlobal(
    'fetch',
    vi.fn<typeof fetch>().mockImplementation(async () => jsonResponse(healthFixture())),
  )
})

afterEach(() => {
  vi.unstubAllGlobals()
})

describe('routes', () => {
  it('renders the queue with its empty state, the hardware panel and the polled status', async () => {
    renderAt('/')
    expect(screen.getByRole('heading', { level: 1, name: 'Queue' })).toBeInTheDocument()
    expect(screen.getByText('No jobs yet')).toBeInTheDocument()
    expect(await screen.findByText('NVIDIA H200', { exact: false })).toBeInTheDocument()
    expect(screen.getByTestId('health-status')).toHaveTextContent('ok')
    expect(fetch).toHaveBeenCalledWith('/api/health', expect.anything())
  })

  it('has a navigation link for every section', () => {
    renderAt('/datasets')
    const nav = screen.getByRole('navigation', { name: 'Main' })
    for (const name of ['Queue', 'New fine-tune', 'Datasets', 'Models', 'Artifacts', 'Compare']) {
      expect(nav).toContainElement(screen.getByRole('link', { name }))
    }
    expect(screen.getByRole('link', { name: 'Datasets' })).toHaveAttribute('aria-current', 'page')
  })

  it.each([
    ['/jobs/new', 'New fine-tune'],
    ['/jobs/42', 'Job 42'],
    ['/datasets', 'Datasets'],
    ['/models', 'Models'],
    ['/artifacts', 'Artifacts'],
    ['/compare', 'Compare'],
    ['/setup', 'Set up Lanner'],
    ['/signin', 'Sign in'],
    ['/no/such/page', 'Page not found'],
  ])('%s shows "%s"', (path, heading) => {
    renderAt(path)
    expect(screen.getByRole('heading', { level: 1, name: heading })).toBeInTheDocument()
  })

  it('puts the loss and throughput charts on the job page', () => {
    renderAt('/jobs/42')
    expect(screen.getByRole('figure', { name: 'Loss' })).toBeInTheDocument()
    expect(screen.getByRole('figure', { name: 'Throughput' })).toBeInTheDocument()
    expect(screen.getAllByText('Waiting for data')).toHaveLength(2)
  })
})
