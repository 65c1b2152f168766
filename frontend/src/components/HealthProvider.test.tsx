import { act, render, screen } from '@testing-library/react'
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import { healthLabel, useHealth } from '../health'
import { healthFixture } from '../test/fixtures'
import type { Health } from '../types'
import { HEALTH_POLL_MS, HealthProvider } from './HealthProvider'

function Probe() {
  const state = useHealth()
  return <span data-testid="probe">{healthLabel(state)}</span>
}

beforeEach(() => {
  vi.useFakeTimers()
})

afterEach(() => {
  vi.useRealTimers()
})

describe('HealthProvider', () => {
  it('polls every 5 s and reports failures as unreachable', async () => {
    const fetcher = vi
      .fn<(signal: AbortSignal) => Promise<Health>>()
      .mockResolvedValueOnce(healthFixture())
      .mockRejectedValueOnce(new TypeError('Failed to fetch'))
      .mockResolvedValue(healthFixture({ status: 'degraded' }))

    render(
      <HealthProvider fetcher={fetcher}>
        <Probe />
      </HealthProvider>,
    )
    expect(screen.getByTestId('probe')).toHaveTextContent('checking')

    await act(() => vi.advanceTimersByTimeAsync(0))
    expect(screen.getByTestId('probe')).toHaveTextContent('ok')
    expect(fetcher).toHaveBeenCalledTimes(1)

    await act(() => vi.advanceTimersByTimeAsync(HEALTH_POLL_MS))
    expect(fetcher).toHaveBeenCalledTimes(2)
    expect(screen.getByTestId('probe')).toHaveTextContent('unreachable')

    await act(() => vi.advanceTimersByTimeAsync(HEALTH_POLL_MS))
    expect(fetcher).toHaveBeenCalledTimes(3)
    expect(screen.getByTestId('probe')).toHaveTextContent('degraded')
  })

  it('stops polling when unmounted', async () => {
    const fetcher = vi.fn<(signal: AbortSignal) => Promise<Health>>().mockResolvedValue(healthFixture())
    const { unmount } = render(<HealthProvider fetcher={fetcher}>{null}</HealthProvider>)
    await act(() => vi.advanceTimersByTimeAsync(0))
    unmount()
    await vi.advanceTimersByTimeAsync(HEALTH_POLL_MS * 3)
    expect(fetcher).toHaveBeenCalledTimes(1)
  })
})
