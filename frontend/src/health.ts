import { createContext, useContext } from 'react'
import type { Health, LlamaCppStatus } from './types'

/** What the app knows about the backend, refreshed by HealthProvider's polling. */
export interface HealthState {
  /** Last report received; kept while the backend is unreachable so the page does not blank. */
  health: Health | null
  /** Why the last poll failed; null after a successful poll. */
  error: string | null
  /** Epoch ms of the last poll that finished, successful or not; null before the first. */
  checkedAt: number | null
}

export const initialHealthState: HealthState = { health: null, error: null, checkedAt: null }

export const HealthContext = createContext<HealthState>(initialHealthState)

export function useHealth(): HealthState {
  return useContext(HealthContext)
}

/** The word shown in the header: the server's status, or why there is none. */
export function healthLabel(state: HealthState): 'ok' | 'degraded' | 'unreachable' | 'checking' {
  if (state.error) return 'unreachable'
  if (state.health) return state.health.status === 'ok' ? 'ok' : 'degraded'
  return 'checking'
}

/** llama.cpp's status when the last report says it is not ready (building, failed or missing); else null. */
export function llamaCppWaiting(state: HealthState): LlamaCppStatus | null {
  const status = state.health?.llama_cpp
  return status && status.state !== 'ready' ? status : null
}
