import { useEffect, useRef, useState } from 'react'
import type { StreamEvent } from '../types'
import { LiveStream, type StreamState } from './LiveStream'

export interface RunningMetrics {
  step: number | null
  totalSteps: number | null
  tokensPerSecond: number | null
  stepTime: number | null
  loss: number | null
}

/**
 * Keeps one live stream per running job (only new events: after=$) and the latest training
 * metric of each, so the queue shows tokens/s and progress as they happen. `onStatus` is called
 * when a job's status changes on its stream (started, finished, failed…).
 */
export function useRunningMetrics(jobIds: number[], onStatus: () => void): Record<number, RunningMetrics> {
  const [metrics, setMetrics] = useState<Record<number, RunningMetrics>>({})
  const statusRef = useRef(onStatus)
  statusRef.current = onStatus
  const key = [...jobIds].sort((a, b) => a - b).join(',')

  useEffect(() => {
    const ids = key ? key.split(',').map(Number) : []
    const streams = ids.map(
      (id) =>
        new LiveStream({
          path: `/ws/jobs/${id}`,
          after: '$',
          onEvents: (events: StreamEvent[]) => {
            let latest: Record<string, unknown> | null = null
            let statusChanged = false
            for (const event of events) {
              if (event.type === 'metric' && event.data.loss !== undefined) latest = event.data
              if (event.type === 'status') statusChanged = true
            }
            if (latest) {
              const d = latest
              const n = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) ? v : null)
              setMetrics((m) => ({
                ...m,
                [id]: {
                  step: n(d.step),
                  totalSteps: n(d.total_steps),
                  tokensPerSecond: n(d.tokens_per_second),
                  stepTime: n(d.step_time),
                  loss: n(d.loss),
                },
              }))
            }
            if (statusChanged) statusRef.current()
          },
        }),
    )
    return () => streams.forEach((s) => s.close())
  }, [key])

  return metrics
}

/** The queue's own stream (added, started, finished, reordered, cancelled, deleted): calls `onChange`. */
export function useQueueStream(onChange: () => void): StreamState {
  const [state, setState] = useState<StreamState>('connecting')
  const changeRef = useRef(onChange)
  changeRef.current = onChange
  useEffect(() => {
    const stream = new LiveStream({
      path: '/ws/queue',
      after: '$',
      onEvents: () => changeRef.current(),
      onState: (s) => {
        setState(s)
        // After a drop the replay covers the gap, but a fresh load is cheap and certain.
        if (s === 'open') changeRef.current()
      },
    })
    return () => stream.close()
  }, [])
  return state
}
