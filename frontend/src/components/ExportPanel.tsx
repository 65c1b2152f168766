import { useCallback, useEffect, useState } from 'react'
import { getJson, postJson } from '../api'
import { formatTime } from '../format'
import { llamaCppWaiting, useHealth } from '../health'
import { stageName } from '../live/exportEvents'
import { specField } from '../specSchema'
import { useExportStream } from '../live/useExportStream'
import type { Artifact, ExportOptions, Job, JobPage } from '../types'
import { ArtifactList } from './ArtifactList'
import { ExportOutcomeTable } from './ExportOutcomeTable'
import { errorText } from './Field'
import { JobStatusBadge } from './JobStatusBadge'
import { LlamaCppNotice } from './LlamaCppNotice'

type GgufType = ExportOptions['gguf_types'][number]
type MergedDtype = ExportOptions['merged_dtype']

/** What the API exports when it is not told otherwise (lanner.core.export_spec), read from its OpenAPI document. */
const DEFAULTS = {
  adapter: specField('adapter', 'ExportCreate').schema.default as boolean,
  merged: specField('merged', 'ExportCreate').schema.default as boolean,
  merged_dtype: specField('merged_dtype', 'ExportCreate').schema.default as MergedDtype,
  gguf_types: specField('gguf_types', 'ExportCreate').schema.default as GgufType[],
  verify: specField('verify', 'ExportCreate').schema.default as boolean,
}
const MERGED_DTYPES = specField('merged_dtype', 'ExportCreate').schema.enum as MergedDtype[]
/** The GGUF types llama.cpp's quantizer makes (lanner.core.export_spec.QUANTIZER_TYPES). */
const LLAMA_CPP_TYPES = (specField('gguf_types', 'ExportCreate').schema as { 'x-llama-cpp-types'?: GgufType[] })['x-llama-cpp-types'] ?? []

/** The GGUF types offered up front; the API knows more (ExportCreate.gguf_types). */
const GGUF_CHOICES: { type: GgufType; help: string }[] = [
  { type: 'f16', help: '16-bit, the reference; largest' },
  { type: 'q8_0', help: '8-bit, near lossless' },
  { type: 'q6_k', help: '6-bit' },
  { type: 'q5_k_m', help: '5-bit' },
  { type: 'q4_k_m', help: '4-bit, the usual choice for laptops' },
]
const ACTIVE = ['queued', 'running']

/** GET the export jobs of some training jobs, newest first. */
export async function fetchExports(): Promise<Job[]> {
  const page = await getJson<JobPage>('/api/jobs?method=export&limit=200')
  return page.items
}

function exportOptionsOf(job: Job): Partial<ExportOptions> {
  const options = job.config.export
  return options && typeof options === 'object' ? (options as Partial<ExportOptions>) : {}
}

function outputsLabel(options: Partial<ExportOptions>): string {
  const parts: string[] = []
  if (options.adapter ?? DEFAULTS.adapter) parts.push('adapter')
  if (options.merged ?? DEFAULTS.merged) parts.push(`merged (${options.merged_dtype ?? DEFAULTS.merged_dtype})`)
  if (options.gguf_types?.length) parts.push(`GGUF ${options.gguf_types.join(', ')}`)
  return parts.join(' · ')
}

/** One export job: live progress while it runs, then its files with sizes, checks and downloads. */
function ExportJobRow({ job: initial }: { job: Job }) {
  const [job, setJob] = useState(initial)
  const [artifacts, setArtifacts] = useState<Artifact[] | null>(null)
  const active = ACTIVE.includes(job.status)
  const options = exportOptionsOf(job)

  const reload = useCallback(async () => {
    try {
      const [j, a] = await Promise.all([getJson<Job>(`/api/jobs/${job.id}`), getJson<Artifact[]>(`/api/jobs/${job.id}/artifacts`)])
      setJob(j)
      setArtifacts(a)
    } catch {
      // The next status event or a page reload tries again.
    }
  }, [job.id])

  useEffect(() => {
    if (!active) void reload()
  }, [active, reload])

  // A finished export with an error is read from its stream once more, for each format's figures.
  const live = useExportStream(job.id, options, active || Boolean(job.error), (status) => {
    if (active && !ACTIVE.includes(status)) {
      void reload()
      setTimeout(() => void reload(), 1500) // the worker records the artifacts just after it publishes
    }
  })
  const percent = Math.round(live.overall * 100)
  // The row is read again only when the export ends; until then its stream says how it stands.
  const status = active && live.status ? live.status : active && live.stage ? 'running' : job.status
  const waiting = status === 'queued'
  return (
    <li className="export" data-testid="export-job" aria-label={`Export ${job.id}`}>
      <div className="artifact__head">
        <JobStatusBadge status={status} testId="export-status" />
        <span className="artifact__name">Export #{job.id}</span>
        <span className="muted small">{outputsLabel(options)}{options.verify === false ? ' · not verified' : ''}</span>
        <span className="muted small">{formatTime(job.created_at)}</span>
      </div>
      {active && (
        <div className="export__progress" role="status">
          <div className="progress">
            <div className="progress__bar" role="progressbar" aria-label={`Export ${job.id} progress`} aria-valuemin={0} aria-valuemax={100} aria-valuenow={percent}>
              <div className="progress__fill" style={{ width: `${percent}%` }} />
            </div>
            <span className="progress__text mono" data-testid="export-percent">{percent}%</span>
          </div>
          <span className="small muted" data-testid="export-stage">
            {waiting ? `Waiting for a worker${job.queue_position ? ` (position ${job.queue_position})` : ''}` : live.stage ? `${stageName(live.stage)} — ${Math.round(live.stageFraction * 100)}%` : 'Starting…'}
          </span>
        </div>
      )}
      {job.error && (live.formats && Object.values(live.formats).some((f) => f.status === 'failed' || f.status === 'not made')
        ? <>
            <p className="error-text">
              {job.status === 'succeeded'
                ? 'Some formats failed their check and were left out; the other files passed theirs and are kept.'
                : 'Nothing of this export passed its check, so nothing was kept.'}
            </p>
            <ExportOutcomeTable formats={live.formats} />
          </>
        : <p className="error-text">{job.error}</p>)}
      {!active && (
        <ArtifactList artifacts={artifacts} finished testId="export-artifacts"
          emptyText={job.status === 'succeeded' ? 'This export wrote no files.' : 'Nothing was kept: a failed or cancelled export leaves no half-written files.'} />
      )}
    </li>
  )
}

interface ExportPanelProps {
  /** The training job to export. */
  job: Job
  /** Its export jobs, newest first; null while loading. */
  exports: Job[] | null
  /** What its training saved: a LoRA adapter, a whole model (full fine-tune, pretraining), or nothing. */
  saved: SavedWeights
  onExported: (exportJob: Job) => void
}

export type SavedWeights = 'adapter' | 'model' | null

/** What a training job saved, from its artifacts: its adapter, else its whole model. */
export function savedWeights(artifacts: { kind: string }[] | null | undefined): SavedWeights {
  if (artifacts?.some((a) => a.kind === 'adapter')) return 'adapter'
  return artifacts?.some((a) => a.kind === 'model') ? 'model' : null
}

/** Start an export of a finished training job, and follow each export with its own progress. */
export function ExportPanel({ job, exports, saved, onExported }: ExportPanelProps) {
  const [adapter, setAdapter] = useState(DEFAULTS.adapter)
  const [merged, setMerged] = useState(DEFAULTS.merged)
  const [dtype, setDtype] = useState<MergedDtype>(DEFAULTS.merged_dtype)
  const [gguf, setGguf] = useState<GgufType[]>(DEFAULTS.gguf_types)
  const [verify, setVerify] = useState(DEFAULTS.verify)
  const [busy, setBusy] = useState(false)
  const [error, setError] = useState<string | null>(null)
  const llamaCppReady = llamaCppWaiting(useHealth()) === null
  const exportable = job.kind === 'train' && job.status === 'succeeded' && saved !== null
  const withAdapter = saved === 'adapter' && adapter  // a whole model has no adapter to export
  const nothing = !withAdapter && !merged && gguf.length === 0

  async function start() {
    setBusy(true)
    setError(null)
    try {
      const body: ExportOptions = { adapter: withAdapter, merged, merged_dtype: dtype, gguf_types: gguf, verify }
      onExported(await postJson<Job>(`/api/jobs/${job.id}/export`, body))
    } catch (err) {
      setError(`Could not start the export: ${errorText(err)}`)
    } finally {
      setBusy(false)
    }
  }

  const toggle = (type: GgufType, on: boolean) => setGguf((list) => (on ? [...list, type] : list.filter((t) => t !== type)))
  return (
    <div className="export-panel" data-testid={`export-panel-${job.id}`}>
      {exportable ? (
        <fieldset className="export-form">
          <legend>Export job #{job.id}</legend>
          <div className="export-form__choices">
            {saved === 'adapter' && (
              <label className="check"><input type="checkbox" checked={adapter} onChange={(e) => setAdapter(e.target.checked)} /> LoRA adapter <span className="muted small">(PEFT, for vLLM and transformers)</span></label>
            )}
            <label className="check"><input type="checkbox" checked={merged} onChange={(e) => setMerged(e.target.checked)} /> {saved === 'adapter' ? 'Merged model' : '16-bit model'}</label>
            <label className="check">
              <span className="visually-hidden">Merged model precision</span>
              <select value={dtype} onChange={(e) => setDtype(e.target.value as MergedDtype)} disabled={!merged} aria-label="Merged model precision">
                {MERGED_DTYPES.map((name) => <option key={name} value={name}>{name}</option>)}
              </select>
            </label>
          </div>
          <div className="export-form__choices" role="group" aria-label="GGUF files">
            <span className="small">GGUF (llama.cpp, Ollama):</span>
            {GGUF_CHOICES.map(({ type, help }) => (
              <label key={type} className="check" title={help}>
                <input type="checkbox" checked={gguf.includes(type)} disabled={!llamaCppReady && LLAMA_CPP_TYPES.includes(type) && !gguf.includes(type)}
                  onChange={(e) => toggle(type, e.target.checked)} /> <span className="mono">{type}</span>
              </label>
            ))}
          </div>
          <LlamaCppNotice title="GGUF k-quants and the check of GGUF files need llama.cpp"
            meanwhile="Meanwhile the adapter, the merged model and GGUF f16 or q8_0 without the check can be exported." />
          <div className="export-form__choices">
            <label className="check"><input type="checkbox" checked={verify} onChange={(e) => setVerify(e.target.checked)} /> Verify every file against the trained model</label>
            <button type="button" className="button button--primary" disabled={busy || nothing} onClick={() => void start()}>
              {busy ? 'Queueing…' : 'Export'}
            </button>
            {nothing && <span className="error-text small">Choose at least one output.</span>}
          </div>
        </fieldset>
      ) : (
        <p className="muted small">
          {job.kind !== 'train' ? 'An export job is not exported again.'
            : job.status !== 'succeeded' ? 'Export becomes possible once the job has succeeded.'
              : 'This job saved no adapter or model, so there is nothing to export.'}
        </p>
      )}
      {error && <p className="error-text" role="alert">{error}</p>}
      {exports && exports.length > 0 && (
        <ul className="exports" aria-label={`Exports of job ${job.id}`}>
          {exports.map((e) => <ExportJobRow key={e.id} job={e} />)}
        </ul>
      )}
    </div>
  )
}
