import { useEffect, useState } from 'react'
import { Link } from 'react-router'
import { getJson } from '../api'
import { ArtifactList } from '../components/ArtifactList'
import { EmptyState } from '../components/EmptyState'
import { ExportPanel, fetchExports, savedWeights } from '../components/ExportPanel'
import { ErrorNotice, errorText } from '../components/Field'
import { PageHeader } from '../components/PageHeader'
import { formatBytes, formatTime } from '../format'
import type { Artifact, Job, JobPage } from '../types'

const JOBS_SHOWN = 20

interface JobArtifacts {
  job: Job
  artifacts: Artifact[]
}

/**
 * What the latest finished training jobs produced, each with its export jobs (their progress,
 * files, sizes and checks) and a form to export it again. The API lists artifacts per job, so
 * this asks each job.
 */
export function ArtifactsPage() {
  const [rows, setRows] = useState<JobArtifacts[] | null>(null)
  const [exports, setExports] = useState<Job[]>([])
  const [error, setError] = useState<string | null>(null)

  useEffect(() => {
    let cancelled = false
    async function load() {
      try {
        const [jobs, exportJobs] = await Promise.all([
          getJson<JobPage>(`/api/jobs?status=succeeded&status=cancelled&status=failed&limit=${JOBS_SHOWN * 2}`),
          fetchExports(),
        ])
        const training = jobs.items.filter((job) => job.kind === 'train').slice(0, JOBS_SHOWN)
        const found = await Promise.all(
          training.map(async (job) => ({ job, artifacts: await getJson<Artifact[]>(`/api/jobs/${job.id}/artifacts`).catch(() => []) })),
        )
        if (!cancelled) {
          setExports(exportJobs)
          setRows(found.filter((row) => row.artifacts.length > 0))
        }
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
        description={`What the latest ${JOBS_SHOWN} finished training jobs produced — adapters, checkpoints, and their exports (merged models, GGUF files) — with sizes, checks and downloads.`}
      />
      {error && <ErrorNotice error={`Could not load the artifacts: ${error}`} />}
      {!rows && !error && <p className="muted">Loading…</p>}
      {rows && rows.length === 0 && (
        <EmptyState title="No artifacts yet">
          <p>Each fine-tune leaves an adapter here; checkpoints appear as jobs save them; exports add merged models and GGUF files.</p>
        </EmptyState>
      )}
      {rows?.map(({ job, artifacts }) => {
        const total = artifacts.reduce((sum, a) => sum + a.size_bytes, 0)
        return (
          <section key={job.id} className="panel" aria-labelledby={`artifacts-${job.id}`} data-testid={`job-artifacts-${job.id}`}>
            <header className="panel__header">
              <h2 id={`artifacts-${job.id}`}>
                <Link to={`/jobs/${job.id}`}>{job.name}</Link> <span className="muted small mono">#{job.id}</span>
              </h2>
              <span className="muted small">{job.status} · {formatTime(job.finished_at)} · {formatBytes(total)}</span>
            </header>
            <div className="panel__body">
              <ArtifactList artifacts={artifacts} finished />
              <ExportPanel job={job} saved={savedWeights(artifacts)}
                exports={exports.filter((e) => e.parent_job_id === job.id)}
                onExported={(e) => setExports((list) => [e, ...list])} />
            </div>
          </section>
        )
      })}
    </>
  )
}
