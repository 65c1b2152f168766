import { formatBytes, formatTime } from '../format'
import type { Artifact } from '../types'

const KIND_NAMES: Record<string, string> = {
  adapter: 'LoRA adapter',
  checkpoint: 'Checkpoint',
  merged: 'Merged model',
  gguf: 'GGUF',
}

export function downloadUrl(artifact: Artifact, file?: string): string {
  const base = `/api/artifacts/${artifact.id}/download`
  return file ? `${base}?file=${encodeURIComponent(file)}` : base
}

/** A job's artifacts with their sizes; a folder artifact lists each of its files for download. */
export function ArtifactList({ artifacts, finished }: { artifacts: Artifact[] | null; finished: boolean }) {
  if (!artifacts) return <p className="muted">Loading…</p>
  if (artifacts.length === 0)
    return <p className="muted">{finished ? 'This job produced no artifacts.' : 'The adapter and checkpoints appear here as the job saves them.'}</p>
  return (
    <ul className="artifacts" data-testid="artifacts">
      {artifacts.map((artifact) => (
        <li key={artifact.id} className="artifact">
          <div className="artifact__head">
            <span className="badge">{KIND_NAMES[artifact.kind] ?? artifact.kind}</span>
            <span className="artifact__name">{artifact.name}</span>
            <span className="mono muted">{formatBytes(artifact.size_bytes)}</span>
            <span className="muted small">{formatTime(artifact.created_at)}</span>
          </div>
          {artifact.files == null ? (
            <a className="button button--small" href={downloadUrl(artifact)} download>
              Download<span className="visually-hidden"> {artifact.name}</span>
            </a>
          ) : (
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
          )}
        </li>
      ))}
    </ul>
  )
}
