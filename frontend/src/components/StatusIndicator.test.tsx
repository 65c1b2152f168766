import { render, screen, within } from '@testing-library/react'
import { describe, expect, it } from 'vitest'
import { healthFixture } from '../test/fixtures'
import { StatusIndicator } from './StatusIndicator'

function part(name: string): HTMLElement {
  const element = document.querySelector<HTMLElement>(`[data-part="${name}"]`)
  if (!element) throw new Error(`no status part ${name}`)
  return element
}

describe('StatusIndicator', () => {
  it('shows ok with three green dots for a healthy system', () => {
    render(<StatusIndicator state={{ health: healthFixture(), error: null, checkedAt: 0 }} />)
    expect(screen.getByTestId('health-status')).toHaveTextContent(/^ok$/)
    expect(part('database')).toHaveAttribute('data-state', 'ok')
    expect(part('redis')).toHaveAttribute('data-state', 'ok')
    expect(part('workers')).toHaveAttribute('data-state', 'ok')
    expect(part('workers')).toHaveTextContent('2 workers')
    expect(within(part('database')).getByRole('tooltip', { hidden: true })).toHaveTextContent(
      'Database: ok — sqlite:///data/lanner.db',
    )
  })

  it('shows degraded with red dots for the failing parts and their detail', () => {
    const health = healthFixture({
      status: 'degraded',
      redis: { ok: false, url: 'redis://127.0.0.1:6379/0', detail: 'Connection refused' },
      workers: [],
    })
    render(<StatusIndicator state={{ health, error: null, checkedAt: 0 }} />)
    expect(screen.getByTestId('health-status')).toHaveTextContent(/^degraded$/)
    expect(part('database')).toHaveAttribute('data-state', 'ok')
    expect(part('redis')).toHaveAttribute('data-state', 'down')
    expect(part('workers')).toHaveAttribute('data-state', 'down')
    expect(part('workers')).toHaveTextContent('0 workers')
    expect(part('redis')).toHaveAccessibleDescription(/Connection refused/)
  })

  it('says unreachable when the health request fails', () => {
    render(<StatusIndicator state={{ health: null, error: 'Failed to fetch', checkedAt: 0 }} />)
    expect(screen.getByTestId('health-status')).toHaveTextContent('unreachable')
    expect(part('database')).toHaveAttribute('data-state', 'down')
  })

  it('says checking before the first answer', () => {
    render(<StatusIndicator state={{ health: null, error: null, checkedAt: null }} />)
    expect(screen.getByTestId('health-status')).toHaveTextContent('checking')
    expect(part('redis')).toHaveAttribute('data-state', 'unknown')
  })
})
