import { useEffect, useState } from 'react'
import { Link } from 'react-router'
import { getJson } from '../api'
import { ArtifactList } from '../components/ArtifactList'
import { EmptyState } from '../components/EmptyState'
import { ErrorNotice, errorText } from '../components/Field'
import { PageHeader } from '../components/PageHeader'
import { formatTime } from '../format'
import type { Artifact, Job, Page } from '../types'

const JOBS_SHOWN = 20

interface JobArtifacts {
  job: Job
  artifacts: Artifact[]
}

/** What the latest finished jobs produced. The API lists artifacts per job only, so this asks each job. */
export function ArtifactsPage() {
  const [rows, setRows] = useState<JobArtifacts[] | null>(null)
  const [error, setError] = useState<string | null>(null)

  useEffect(() => {
    let cancelled = false
    async function load() {
      try {
        const jobs = await getJson<Page<Job>>(`/api/jobs?status=succeeded&status=cancelled&status=failed&limit=${JOBS_SHOWN}`)
        const found = await Promise.all(
          jobs.items.map(async (job) => ({ job, artifacts: await getJson<Artifact[]>(`/api/jobs/${job.id}/artifacts`).catch(() => []) })),
        )
        if (!cancelled) setRows(found.filter((row) => row.artifacts.length > 0))
      } catch (err) {
        if (!cancelled) setError(errorText(err))
      }
    }
    void load()
    return () => {
      cancelled = true
    }
  }, [])

  return (
    <>
      <PageHeader
        title="Artifacts"
        description={`What the latest ${JOBS_SHOWN} finished jobs produced — LoRA adapters and checkpoints — ready to download.`}
      />
      {error && <ErrorNotice error={`Could not load the artifacts: ${error}`} />}
      {!rows && !error && <p className="muted">Loading…</p>}
      {rows && rows.length === 0 && (
        <EmptyState title="No artifacts yet">
          <p>Each fine-tune leaves an adapter here; checkpoints appear as jobs save them.</p>
        </EmptyState>
      )}
      {rows?.map(({ job, artifacts }) => (
        <section key={job.id} className="panel" aria-labelledby={`artifacts-${job.id}`}>
          <header className="panel__header">
            <h2 id={`artifacts-${job.id}`}>
              <Link to={`/jobs/${job.id}`}>{job.name}</Link> <span className="muted small mono">#{job.id}</span>
            </h2>
            <span className="muted small">{job.status} · {formatTime(job.finished_at)}</span>
          </header>
          <div className="panel__body">
            <ArtifactList artifacts={artifacts} finished />
          </div>
        </section>
      ))}
    </>
  )
}
