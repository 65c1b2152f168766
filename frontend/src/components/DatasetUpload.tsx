import { useRef, useState, type ChangeEvent } from 'react'
import { ApiError, uploadFile, type UploadProgress } from '../api'
import { formatBytes } from '../format'
import type { Dataset, DatasetReport as Report } from '../types'
import { DatasetReport } from './DatasetReport'
import { errorText } from './Field'

const ACCEPT = '.jsonl,.json,.csv,.parquet'

/**
 * Uploads one dataset file with a progress bar; then shows the server's validation report, or
 * why the file was refused (with the report of its bad rows when there is one).
 */
export function DatasetUpload({ onUploaded }: { onUploaded: (dataset: Dataset) => void }) {
  const input = useRef<HTMLInputElement>(null)
  const [progress, setProgress] = useState<UploadProgress | null>(null)
  const [phase, setPhase] = useState<'idle' | 'uploading' | 'checking'>('idle')
  const [error, setError] = useState<string | null>(null)
  const [failedReport, setFailedReport] = useState<Report | null>(null)
  const [done, setDone] = useState<Dataset | null>(null)

  async function upload(event: ChangeEvent<HTMLInputElement>) {
    const file = event.target.files?.[0]
    if (!file) return
    setError(null)
    setFailedReport(null)
    setDone(null)
    const extension = file.name.includes('.') ? file.name.slice(file.name.lastIndexOf('.')).toLowerCase() : ''
    if (!ACCEPT.split(',').includes(extension)) {
      setError(`This kind of file cannot be used: ${file.name} is not a .jsonl, .json, .csv or .parquet file.`)
      if (input.current) input.current.value = ''
      return
    }
    setPhase('uploading')
    setProgress({ loaded: 0, total: file.size })
    try {
      const params = new URLSearchParams({ filename: file.name })
      const dataset = await uploadFile<Dataset>(`/api/datasets?${params}`, file, (p) => {
        setProgress(p)
        if (p.loaded >= p.total) setPhase('checking')
      })
      setDone(dataset)
      onUploaded(dataset)
    } catch (err) {
      if (err instanceof ApiError) {
        const body = err.body as { report?: Report } | null
        if (body && typeof body === 'object' && body.report) setFailedReport(body.report)
        const reasons: Record<number, string> = {
          413: 'The file is too large',
          415: 'This kind of file cannot be used',
          422: 'This file cannot be used for training',
        }
        setError(`${reasons[err.status] ?? 'The upload failed'}: ${err.message}`)
      } else setError(errorText(err))
    } finally {
      setPhase('idle')
      setProgress(null)
      if (input.current) input.current.value = ''
    }
  }

  const percent = progress && progress.total ? Math.round((progress.loaded / progress.total) * 100) : 0
  return (
    <div className="upload">
      <label className="button upload__button">
        Upload a dataset file…
        <input ref={input} type="file" accept={ACCEPT} className="visually-hidden" onChange={(e) => void upload(e)}
          disabled={phase !== 'idle'} data-testid="dataset-file" />
      </label>
      <span className="muted small">JSONL, JSON, CSV or Parquet: chat messages, prompt/completion, instruction/output, text, or preference pairs.</span>
      {phase !== 'idle' && progress && (
        <div className="upload__progress" role="status">
          <progress max={100} value={percent} aria-label="Upload progress" />
          <span className="small">
            {phase === 'uploading'
              ? `Uploading ${formatBytes(progress.loaded)} of ${formatBytes(progress.total)} (${percent}%)`
              : 'Checking every row…'}
          </span>
        </div>
      )}
      {error && (
        <div className="notice notice--error" role="alert" data-testid="upload-error">
          <p>{error}</p>
          {failedReport && <DatasetReport report={failedReport} title="What the server found" showError={false} />}
        </div>
      )}
      {done && (
        <div className="notice notice--ok" role="status">
          <p className="notice__title">Uploaded “{done.name}” ({formatBytes(done.size_bytes)}).</p>
          <DatasetReport report={done.report} />
        </div>
      )}
    </div>
  )
}
