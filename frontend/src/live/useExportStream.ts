import { useEffect, useRef, useState } from 'react'
import type { ExportOptions } from '../types'
import { applyExportEvents, emptyExportLive, type ExportLive } from './exportEvents'
import { LiveStream } from './LiveStream'

/** An export job's progress from its stream (replayed from the start), while `active`. */
export function useExportStream(jobId: number, options: Partial<ExportOptions>, active: boolean, onStatus?: (status: string) => void): ExportLive {
  const [live, setLive] = useState<ExportLive>(() => emptyExportLive(options))
  const statusRef = useRef(onStatus)
  statusRef.current = onStatus
  const optionsRef = useRef(options)
  optionsRef.current = options

  useEffect(() => {
    if (!active) return
    setLive(emptyExportLive(optionsRef.current))
    const stream = new LiveStream({
      path: `/ws/jobs/${jobId}`,
      after: '0-0',
      onEvents: (events) => {
        setLive((current) => applyExportEvents(current, events))
        const status = [...events].reverse().find((e) => e.type === 'status')
        if (status) statusRef.current?.(String(status.data.status))
      },
    })
    return () => stream.close()
  }, [jobId, active])

  return live
}
