import { useState } from 'react'
import { useNavigate } from 'react-router'
import { postJson } from '../api'
import { formatBytes, formatTime } from '../format'
import type { Artifact, Job } from '../types'
import { archiveUrl, downloadUrl } from './ArtifactList'
import { errorText } from './Field'

/** "checkpoint-40" → 40; null for other names. */
export function checkpointStep(name: string): number | null {
  const match = /(\d+)$/.exec(name)
  return match ? Number(match[1]) : null
}

/**
 * A job's checkpoints, newest first, with their files; a failed or cancelled job can be resumed
 * from any of them (POST /api/jobs/{id}/retry with resume_from: a new job continues from there).
 */
export function CheckpointList({ job, checkpoints, canManage }: { job: Job; checkpoints: Artifact[]; canManage: boolean }) {
  const navigate = useNavigate()
  const [busy, setBusy] = useState<string | null>(null)
  const [error, setError] = useState<string | null>(null)
  const resumable = canManage && (job.status === 'failed' || job.status === 'cancelled')
  const sorted = [...checkpoints].sort((a, b) => (checkpointStep(b.name) ?? 0) - (checkpointStep(a.name) ?? 0))

  async function resume(name: string) {
    setBusy(name)
    setError(null)
    try {
      const next = await postJson<Job>(`/api/jobs/${job.id}/retry`, { resume_from: name })
      navigate(`/jobs/${next.id}`)
    } catch (err) {
      setError(`Could not resume from ${name}: ${errorText(err)}`)
      setBusy(null)
    }
  }

  if (sorted.length === 0) {
    return <p className="muted">{job.status === 'running' || job.status === 'queued' ? 'Checkpoints appear here as the job saves them (set “Save every N steps” to save more often).' : 'This job saved no checkpoints.'}</p>
  }
  return (
    <>
      {error && <p className="error-text" role="alert">{error}</p>}
      {!resumable && (job.status === 'failed' || job.status === 'cancelled') && <p className="muted small">Only the job’s owner or an admin can resume it.</p>}
      <table className="table table--compact" aria-label="Checkpoints" data-testid="checkpoints">
        <thead>
          <tr><th scope="col" className="num">Step</th><th scope="col">Name</th><th scope="col" className="num">Size</th><th scope="col">Saved</th><th scope="col"><span className="visually-hidden">Actions</span></th></tr>
        </thead>
        <tbody>
          {sorted.map((c) => (
            <tr key={c.id}>
              <td className="num mono">{checkpointStep(c.name) ?? '—'}</td>
              <td className="mono">{c.name}</td>
              <td className="num mono">{formatBytes(c.size_bytes)}</td>
              <td className="nowrap">{formatTime(c.created_at)}</td>
              <td className="nowrap">
                {resumable && (
                  <button type="button" className="button button--small" disabled={busy != null} onClick={() => void resume(c.name)}>
                    {busy === c.name ? 'Queueing…' : 'Resume from here'}<span className="visually-hidden"> ({c.name})</span>
                  </button>
                )}{' '}
                {c.files && c.files.length > 0 && (
                  <a className="button button--small" href={archiveUrl(c)} download>
                    Download (.tar)<span className="visually-hidden"> {c.name}</span>
                  </a>
                )}{' '}
                {c.files && c.files.length > 0 && (
                  <details className="artifact__files">
                    <summary>{c.files.length} files</summary>
                    <ul>{c.files.map((f) => <li key={f}><a href={downloadUrl(c, f)} download className="mono">{f}</a></li>)}</ul>
                  </details>
                )}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </>
  )
}
