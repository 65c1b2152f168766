import { useCallback, useEffect, useState } from 'react'
import { getJson, postJson } from '../api'
import { errorText } from '../components/Field'
import type { GpuSession } from './types'

/** How often an open GPU session's job is read again (queue position, running, ended). */
export const SESSION_POLL_MS = 3000

export function sessionOpen(session: GpuSession | null): boolean {
  return session != null && (session.status === 'queued' || session.status === 'running')
}

/** The GPU session's state in words. */
export function sessionText(session: GpuSession): string {
  if (session.status === 'queued') {
    const place = session.queue_position != null ? `number ${session.queue_position} in the queue` : 'in the queue'
    return `Waiting for a GPU: ${place} (job ${session.id}). Questions wait with it; the CPU path needs no GPU.`
  }
  if (session.status === 'running') {
    return `GPU session running${session.device?.name ? ` on ${session.device.name}` : ''} (job ${session.id}).`
  }
  return `The GPU session (job ${session.id}) has ended (${session.status})${session.error ? `: ${session.error}` : ''}.`
}

/** A GPU chat session: started for a job (a queued job of kind `chat`), read again while open, closed. */
export function useGpuSession() {
  const [session, setSession] = useState<GpuSession | null>(null)
  const [error, setError] = useState<string | null>(null)

  const start = useCallback(async (jobId: number) => {
    setError(null)
    try {
      setSession(await postJson<GpuSession>(`/api/playground/jobs/${jobId}/gpu-session`, {}))
    } catch (err) {
      setSession(null)
      setError(errorText(err))
    }
  }, [])

  const close = useCallback(async () => {
    const current = session
    setSession(null)
    setError(null)
    if (current && sessionOpen(current)) {
      try {
        await postJson(`/api/playground/gpu-sessions/${current.id}/close`, {})
      } catch {
        // it ended meanwhile: nothing left to close
      }
    }
  }, [session])

  const id = session?.id
  const open = sessionOpen(session)
  useEffect(() => {
    if (id == null || !open) return
    const timer = window.setInterval(() => {
      getJson<GpuSession>(`/api/jobs/${id}`).then(
        (fresh) => setSession((current) => (current?.id === fresh.id ? fresh : current)), // closed meanwhile: stays closed
        () => undefined,
      )
    }, SESSION_POLL_MS)
    return () => window.clearInterval(timer)
  }, [id, open])

  return { session, error, start, close }
}
