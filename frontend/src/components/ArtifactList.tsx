import { formatBytes, formatTime } from '../format'
import type { Artifact } from '../types'
import { VerificationResult } from './VerificationResult'

const KIND_NAMES: Record<string, string> = {
  adapter: 'LoRA adapter',
  checkpoint: 'Checkpoint',
  merged: 'Merged model',
  gguf: 'GGUF',
  modelfile: 'Ollama Modelfile',
  tensorboard: 'TensorBoard event files',
  wandb: 'W&B offline run (wandb sync uploads it)',
}

export function downloadUrl(artifact: Artifact, file?: string): string {
  const base = `/api/artifacts/${artifact.id}/download`
  return file ? `${base}?file=${encodeURIComponent(file)}` : base
}

/** A folder artifact's files as one tar stream (no ranges: an interrupted download starts again). */
export function archiveUrl(artifact: Artifact): string {
  return `${downloadUrl(artifact)}?archive=tar`
}

interface ArtifactListProps {
  artifacts: Artifact[] | null
  finished: boolean
  /** What to say when there are none; defaults to a training job's wording. */
  emptyText?: string
  testId?: string
}

/**
 * Artifacts with their sizes and verification results; a folder artifact downloads whole (.tar) or
 * lists each of its files for download.
 */
export function ArtifactList({ artifacts, finished, emptyText, testId = 'artifacts' }: ArtifactListProps) {
  if (!artifacts) return <p className="muted">Loading…</p>
  if (artifacts.length === 0)
    return <p className="muted">{emptyText ?? (finished ? 'This job produced no artifacts.' : 'The adapter and checkpoints appear here as the job saves them.')}</p>
  return (
    <ul className="artifacts" data-testid={testId}>
      {artifacts.map((artifact) => (
        <li key={artifact.id} className="artifact">
          <div className="artifact__head">
            <span className="badge">{KIND_NAMES[artifact.kind] ?? artifact.kind}</span>
            <span className="artifact__name">{artifact.name}</span>
            <span className="mono muted" data-testid="artifact-size">{formatBytes(artifact.size_bytes)}</span>
            <span className="muted small">{formatTime(artifact.created_at)}</span>
          </div>
          {artifact.verification && <VerificationResult verification={artifact.verification} />}
          {artifact.files == null ? (
            <a className="button button--small" href={downloadUrl(artifact)} download>
              Download<span className="visually-hidden"> {artifact.name}</span>
            </a>
          ) : (
            <>
              <a className="button button--small" href={archiveUrl(artifact)} download>
                Download folder (.tar)<span className="visually-hidden"> {artifact.name}</span>
              </a>
              <details className="artifact__files" open={artifact.kind === 'adapter'}>
                <summary>{artifact.files.length} files</summary>
                <ul>
                  {artifact.files.map((file) => (
                    <li key={file}>
                      <a href={downloadUrl(artifact, file)} download className="mono">{file}</a>
                    </li>
                  ))}
                </ul>
              </details>
            </>
          )}
        </li>
      ))}
    </ul>
  )
}
