import { useEffect, useState, type ReactNode } from 'react'
import { fetchHealth } from '../api'
import { HealthContext, initialHealthState, type HealthState } from '../health'
import type { Health } from '../types'

export const HEALTH_POLL_MS = 5000

interface Props {
  children: ReactNode
  intervalMs?: number
  /** Injected in tests; defaults to GET /api/health. */
  fetcher?: (signal: AbortSignal) => Promise<Health>
}

/**
 * Polls the backend's health once for the whole app (header indicator, hardware panel).
 * The next poll is scheduled after the previous one settles, so a slow backend never
 * accumulates overlapping requests.
 */
export function HealthProvider({ children, intervalMs = HEALTH_POLL_MS, fetcher = fetchHealth }: Props) {
  const [state, setState] = useState<HealthState>(initialHealthState)

  useEffect(() => {
    const controller = new AbortController()
    let timer: ReturnType<typeof setTimeout> | undefined

    async function poll() {
      try {
        const health = await fetcher(controller.signal)
        setState({ health, error: null, checkedAt: Date.now() })
      } catch (error) {
        if (controller.signal.aborted) return
        const message = error instanceof Error ? error.message : String(error)
        setState((previous) => ({ ...previous, error: message, checkedAt: Date.now() }))
      }
      if (!controller.signal.aborted) timer = setTimeout(poll, intervalMs)
    }

    void poll()
    return () => {
      controller.abort()
      clearTimeout(timer)
    }
  }, [fetcher, intervalMs])

  return <HealthContext.Provider value={state}>{children}</HealthContext.Provider>
}
