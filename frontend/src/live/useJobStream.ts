import { useEffect, useRef, useState } from 'react'
import { applyJobEvents, emptyJobLive, type JobLive } from './jobEvents'
import { LiveStream, type StreamState } from './LiveStream'

/**
 * A job's whole event stream: replayed from the start (after=0-0) when the page opens, so the
 * charts are whole after a reload, then live; after a drop it continues after the last event.
 */
export function useJobStream(jobId: string, onStatus?: (status: string) => void): { live: JobLive; state: StreamState; detail: string | null } {
  const [live, setLive] = useState<JobLive>(emptyJobLive)
  const [state, setState] = useState<StreamState>('connecting')
  const [detail, setDetail] = useState<string | null>(null)
  const statusRef = useRef(onStatus)
  statusRef.current = onStatus

  useEffect(() => {
    setLive(emptyJobLive())
    const stream = new LiveStream({
      path: `/ws/jobs/${encodeURIComponent(jobId)}`,
      after: '0-0',
      onEvents: (events) => {
        setLive((current) => applyJobEvents(current, events))
        const status = [...events].reverse().find((e) => e.type === 'status' || e.type === 'cancel_requested')
        if (status) statusRef.current?.(status.type === 'status' ? (status.data.status ?? status.type) : status.type)
      },
      onState: (s, why) => {
        setState(s)
        setDetail(why ?? null)
      },
    })
    return () => stream.close()
  }, [jobId])

  return { live, state, detail }
}
