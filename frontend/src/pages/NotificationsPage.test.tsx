import { fireEvent, render, screen, within } from '@testing-library/react'
import { createMemoryRouter, RouterProvider } from 'react-router'
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import { routes } from '../routes'
import { apiFetchMock } from '../test/fixtures'

vi.mock('uplot', () => ({ default: class {} }))

const hook = { id: 5, url: 'https://example.com/hook', events: ['finished', 'failed'], created_at: '2026-12-02T12:00:00Z' }
const delivery = {
  id: 9, webhook_id: 5, job_id: 3, event: 'finished', state: 'pending', attempts: 1, status_code: 500,
  error: 'The receiver answered 500 (Internal Server Error).', next_try_at: '2026-12-02T12:00:15Z',
  created_at: '2026-12-02T12:00:00Z', delivered_at: null,
}
let posted: { path: string; body: unknown }[]

beforeEach(() => {
  posted = []
  const base = apiFetchMock({ '/api/webhooks': [hook], '/api/webhooks/5/deliveries': [delivery] })
  vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockImplementation(async (input, init) => {
    const path = String(input)
    if (init?.method === 'POST' && path === '/api/webhooks') {
      const body = JSON.parse(String(init.body))
      posted.push({ path, body })
      if (body.url.startsWith('ftp:')) {
        return new Response(JSON.stringify({ detail: [{ loc: ['body', 'url'], msg: 'The URL must be an http:// or https:// URL', type: 'value_error' }] }), { status: 422 })
      }
      return new Response(JSON.stringify({ ...hook, id: 6, url: body.url, events: body.events, secret: 'a'.repeat(64) }), { status: 201 })
    }
    if (init?.method === 'POST') {
      posted.push({ path, body: null })
      return new Response(JSON.stringify({ ...delivery, id: 10, event: 'test' }), { status: 202 })
    }
    return base(path)
  }))
})

afterEach(() => {
  vi.unstubAllGlobals()
})

describe('NotificationsPage', () => {
  it('shows each webhook with its delivery log and sends a test', async () => {
    render(<RouterProvider router={createMemoryRouter(routes, { initialEntries: ['/account/notifications'] })} />)
    const panel = await screen.findByRole('region', { name: 'Webhook https://example.com/hook' })
    const log = await within(panel).findByTestId('deliveries-5')
    expect(log).toHaveTextContent('The receiver answered 500')
    expect(log).toHaveTextContent('pending')
    fireEvent.click(within(panel).getByRole('button', { name: 'Send test' }))
    await vi.waitFor(() => expect(posted).toContainEqual({ path: '/api/webhooks/5/test', body: null }))
    expect(await screen.findByText(/No SMTP server is set up/)).toBeInTheDocument()
    expect(screen.getByRole('checkbox', { name: /E-mail me/ })).toBeDisabled()
  })

  it('adds a webhook with the chosen events, shows its secret once, and a refused URL in words', async () => {
    render(<RouterProvider router={createMemoryRouter(routes, { initialEntries: ['/account/notifications'] })} />)
    const url = await screen.findByRole('textbox', { name: 'URL' })
    fireEvent.change(url, { target: { value: 'ftp://example.com/' } })
    fireEvent.click(screen.getByRole('button', { name: 'Add webhook' }))
    expect(await screen.findByText('The URL must be an http:// or https:// URL')).toBeInTheDocument()

    fireEvent.change(url, { target: { value: 'https://example.com/new' } })
    fireEvent.click(screen.getByRole('checkbox', { name: 'Waiting' }))
    fireEvent.click(screen.getByRole('checkbox', { name: 'Failed' }))
    fireEvent.click(screen.getByRole('button', { name: 'Add webhook' }))
    expect(await screen.findByTestId('new-webhook')).toHaveTextContent('a'.repeat(64))
    expect(posted.at(-1)).toEqual({ path: '/api/webhooks', body: { url: 'https://example.com/new', events: ['finished', 'waiting'] } })
  })
})
