import { useEffect, useRef, useState } from 'react'
import type { ExportOptions } from '../types'
import { applyExportEvents, emptyExportLive, type ExportLive } from './exportEvents'
import { FINAL_STATUSES } from './jobEvents'
import { LiveStream } from './LiveStream'


/**
 * An export job's progress from its stream (replayed from the start), while `follow`: a running
 * export's, or a finished one's to read how each format fared. The stream is closed at the job's
 * final status: nothing comes after it.
 */
export function useExportStream(jobId: number, options: Partial<ExportOptions>, follow: boolean, onStatus?: (status: string) => void): ExportLive {
  const [live, setLive] = useState<ExportLive>(() => emptyExportLive(options))
  const statusRef = useRef(onStatus)
  statusRef.current = onStatus
  const optionsRef = useRef(options)
  optionsRef.current = options

  useEffect(() => {
    if (!follow) return
    setLive(emptyExportLive(optionsRef.current))
    const stream = new LiveStream({
      path: `/ws/jobs/${jobId}`,
      after: '0-0',
      onEvents: (events) => {
        setLive((current) => applyExportEvents(current, events))
        const status = [...events].reverse().find((e) => e.type === 'status')
        if (status) statusRef.current?.(String(status.data.status))
        if (status && FINAL_STATUSES.includes(String(status.data.status))) stream.close()
      },
    })
    return () => stream.close()
  }, [jobId, follow])

  return live
}
