import { render, screen, within } from '@testing-library/react'
import { describe, expect, it } from 'vitest'
import { healthFixture, llamaCppBuilding } from '../test/fixtures'
import { StatusIndicator } from './StatusIndicator'

function part(name: string): HTMLElement {
  const element = document.querySelector<HTMLElement>(`[data-part="${name}"]`)
  if (!element) throw new Error(`no status part ${name}`)
  return element
}

describe('StatusIndicator', () => {
  it('shows ok with a green dot for each part of a healthy system', () => {
    render(<StatusIndicator state={{ health: healthFixture(), error: null, checkedAt: 0 }} />)
    expect(screen.getByTestId('health-status')).toHaveTextContent(/^ok$/)
    expect(part('database')).toHaveAttribute('data-state', 'ok')
    expect(part('redis')).toHaveAttribute('data-state', 'ok')
    expect(part('workers')).toHaveAttribute('data-state', 'ok')
    expect(part('workers')).toHaveTextContent('2 workers')
    expect(part('llama-cpp')).toHaveAttribute('data-state', 'ok')
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

  it('shows llama.cpp as pending while it is built, and down with its log when the build failed', () => {
    const { rerender } = render(<StatusIndicator state={{ health: healthFixture({ llama_cpp: llamaCppBuilding }), error: null, checkedAt: 0 }} />)
    expect(screen.getByTestId('health-status')).toHaveTextContent(/^ok$/)
    expect(part('llama-cpp')).toHaveAttribute('data-state', 'pending')
    expect(part('llama-cpp')).toHaveAccessibleDescription(/still being built \(since 11:20 UTC\); ready in a few minutes/)
    const failed = { ...llamaCppBuilding, state: 'failed' as const, detail: "llama.cpp's build failed at 11:24 UTC: its log says why." }
    rerender(<StatusIndicator state={{ health: healthFixture({ llama_cpp: failed }), error: null, checkedAt: 0 }} />)
    expect(part('llama-cpp')).toHaveAttribute('data-state', 'down')
    expect(part('llama-cpp')).toHaveAccessibleDescription(/build failed at 11:24 UTC.*Log: \/srv\/lanner\/data\/logs\/llama-cpp-build.log/)
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
