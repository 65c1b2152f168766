import { useEffect, useMemo, useRef, useState } from 'react'
import { ApiError, getJson } from '../api'
import { lengthHistogram } from '../tokenHistogram'
import type { Dataset, DatasetPreview, TokenStats } from '../types'
import { numberedByName } from './DatasetReport'
import { errorText } from './Field'

const DEBOUNCE_MS = 400
const PREVIEW_ROWS = 3

interface Props {
  dataset: Dataset
  model: string
  maxSeqLen: number | null
  /** Continued pretraining: rows longer than the max length are split into rows of it, not cut. */
  splitsLongRows?: boolean
}

/**
 * What the model will learn from a dataset with these settings: its usable rows rendered through
 * the model's chat template a page at a time (each named by its line in the file), with the trained
 * tokens highlighted, and the token lengths as a histogram with the rows the max sequence length
 * would cut.
 */
export function DatasetInsights({ dataset, model, maxSeqLen, splitsLongRows = false }: Props) {
  const [preview, setPreview] = useState<DatasetPreview | null>(null)
  const [stats, setStats] = useState<TokenStats | null>(null)
  const [error, setError] = useState<string | null>(null)
  const [unavailable, setUnavailable] = useState<string | null>(null)
  const [attempt, setAttempt] = useState(0)  // asked again while the built-in model is being imported
  const length = maxSeqLen && maxSeqLen >= 16 ? maxSeqLen : null
  const paging = useRef<AbortController | null>(null)

  useEffect(() => {
    if (!model || !length) return
    const abort = new AbortController()
    const query = new URLSearchParams({ model, max_seq_len: String(length) })
    let retry: ReturnType<typeof setTimeout> | undefined
    const failed = (err: unknown) => {
      if (abort.signal.aborted) return
      if (err instanceof ApiError && (err.status === 409 || err.status === 503)) {
        setUnavailable(err.message)
        // 503: the tokenizer is on its way (the built-in model being imported); ask again when the API says.
        if (err.status === 503) retry = setTimeout(() => setAttempt((n) => n + 1), (err.retryAfterSeconds ?? 15) * 1000)
      } else setError(errorText(err))
    }
    // One after the other: the first request loads the tokenizer into the API process, and the
    // second then finds it loaded (two first loads at once can trip over each other there).
    const timer = setTimeout(async () => {
      try {
        setPreview(await getJson<DatasetPreview>(previewPath(dataset.id, query, 0), abort.signal))
        setError(null)
        setUnavailable(null)
      } catch (err) {
        failed(err)
        return
      }
      try {
        setStats(await getJson<TokenStats>(`/api/datasets/${dataset.id}/token-stats?${query}`, abort.signal))
      } catch (err) {
        failed(err)
      }
    }, DEBOUNCE_MS)
    return () => {
      abort.abort()
      paging.current?.abort()
      clearTimeout(timer)
      clearTimeout(retry)
    }
  }, [dataset.id, model, length, attempt])

  /** Another page of the preview, with the same model and length; the token statistics stay. */
  async function showPage(offset: number) {
    if (!length) return
    paging.current?.abort()
    const abort = new AbortController()
    paging.current = abort
    try {
      setPreview(await getJson<DatasetPreview>(previewPath(dataset.id, new URLSearchParams({ model, max_seq_len: String(length) }), offset), abort.signal))
      setError(null)
    } catch (err) {
      if (!abort.signal.aborted) setError(errorText(err))
    }
  }

  return (
    <div className="insights" data-testid="dataset-insights">
      {unavailable && (
        <p className="notice" role="status">The preview needs {model}’s tokenizer on the server: {unavailable}</p>
      )}
      {error && <p className="error-text">Could not render the preview: {error}</p>}
      {!preview && !unavailable && !error && <p className="muted small">Rendering the first rows through the model’s chat template…</p>}
      {stats && length && <LengthHistogramView stats={stats} maxSeqLen={length} splitsLongRows={splitsLongRows} />}
      {preview && <PreviewView preview={preview} onPage={(offset) => void showPage(offset)} splitsLongRows={splitsLongRows} />}
    </div>
  )
}

function LengthHistogramView({ stats, maxSeqLen, splitsLongRows }: { stats: TokenStats; maxSeqLen: number; splitsLongRows: boolean }) {
  const histogram = useMemo(() => (stats.lengths ? lengthHistogram(stats.lengths, maxSeqLen) : null), [stats.lengths, maxSeqLen])
  const truncated = histogram ? histogram.truncated : (stats.over_max_seq_len ?? 0)
  const sequences = stats.sequences
  const unit = stats.task === 'preference' ? 'sequences (each pair is two)' : 'rows'
  return (
    <section className="report" aria-label="Token lengths" data-testid="token-stats">
      <h3 className="report__title">Token lengths</h3>
      <p data-testid="truncation" className={truncated > 0 && !splitsLongRows ? 'warning-text' : undefined}>
        {truncated === 0
          ? `All ${sequences} ${unit} fit in ${maxSeqLen} tokens.`
          : splitsLongRows
            ? `${truncated} of ${sequences} ${unit} are longer than ${maxSeqLen} tokens: each is split into rows of ${maxSeqLen}, every token trained on.`
            : `${truncated} of ${sequences} ${unit} are longer than ${maxSeqLen} tokens and would be cut.`}
        {stats.rows_total && stats.rows_total > stats.rows_measured ? <span className="muted small"> Measured on the first {stats.rows_measured} of {stats.rows_total} rows.</span> : null}
      </p>
      <dl className="facts facts--row small">
        <div><dt>min</dt><dd className="mono">{stats.min ?? '—'}</dd></div>
        <div><dt>median</dt><dd className="mono">{stats.p50 ?? '—'}</dd></div>
        <div><dt>mean</dt><dd className="mono">{stats.mean ?? '—'}</dd></div>
        <div><dt>95th percentile</dt><dd className="mono">{stats.p95 ?? '—'}</dd></div>
        <div><dt>max</dt><dd className="mono">{stats.max ?? '—'}</dd></div>
        <div><dt>trained tokens</dt><dd className="mono">{stats.trained_tokens?.toLocaleString('en-US') ?? '—'} of {stats.total_tokens?.toLocaleString('en-US') ?? '—'}</dd></div>
      </dl>
      {histogram && histogram.total > 0 && (
        <figure className="histogram" aria-label={`Histogram of token lengths; the bars past ${maxSeqLen} would be cut`}>
          <div className="histogram__bars" data-testid="length-histogram">
            {histogram.bins.map((bin) => (
              <div key={bin.from} className="histogram__bin" title={`${bin.from}–${bin.to - 1} tokens: ${bin.kept + bin.cut}${bin.cut ? ` (${bin.cut} cut)` : ''}`}>
                <div className="histogram__cut" style={{ height: `${(bin.cut / histogram.peak) * 100}%` }} />
                <div className="histogram__kept" style={{ height: `${(bin.kept / histogram.peak) * 100}%` }} />
              </div>
            ))}
          </div>
          <figcaption className="histogram__axis small muted">
            <span>0</span>
            <span>tokens per {stats.task === 'preference' ? 'sequence' : 'row'} · <span className="histogram__legend-cut">■</span> {splitsLongRows ? 'split' : 'cut'} at {maxSeqLen}</span>
            <span>{histogram.bins.at(-1)!.to - 1}</span>
          </figcaption>
        </figure>
      )}
    </section>
  )
}

function previewPath(datasetId: number, query: URLSearchParams, offset: number): string {
  return `/api/datasets/${datasetId}/preview?${query}&rows=${PREVIEW_ROWS}&offset=${offset}`
}

/** The usable rows of one page, each named by its line in the file, and the way to every other page. */
export function PreviewView({ preview, onPage, splitsLongRows = false }: { preview: DatasetPreview; onPage: (offset: number) => void; splitsLongRows?: boolean }) {
  const unit = numberedByName(preview.numbered_by)
  const shown = new Set(preview.rows.map((seq) => seq.line)).size
  const first = preview.offset + 1
  const last = preview.offset + shown
  // What was typed belongs to the page it was typed on; a new page starts from its own first row.
  const [typed, setTyped] = useState<{ offset: number; value: string } | null>(null)
  const start = typed !== null && typed.offset === preview.offset ? typed.value : String(first)
  const setStart = (value: string) => setTyped({ offset: preview.offset, value })
  const wanted = Math.trunc(Number(start))
  const valid = Number.isFinite(wanted) && wanted >= 1 && wanted <= preview.total
  return (
    <section className="report" aria-label="Rendered samples" data-testid="dataset-preview">
      <h3 className="report__title">How the model sees its rows</h3>
      <p className="muted small">
        Rendered with {preview.model}’s chat template. <mark className="trained">Highlighted</mark> tokens are trained on (the loss is
        computed there); the rest is context.
      </p>
      <nav className="preview-pages small" aria-label="Preview pages">
        <button type="button" className="button button--small" disabled={preview.offset === 0}
          onClick={() => onPage(Math.max(preview.offset - PREVIEW_ROWS, 0))}>Previous</button>
        <span data-testid="preview-range">
          {shown > 0 ? `Usable rows ${first}–${last} of ${preview.total}` : `No usable row past ${preview.offset} of ${preview.total}`}
        </span>
        <button type="button" className="button button--small" disabled={preview.offset + PREVIEW_ROWS >= preview.total}
          onClick={() => onPage(preview.offset + PREVIEW_ROWS)}>Next</button>
        <form className="preview-pages__jump" onSubmit={(event) => { event.preventDefault(); if (valid) onPage(wanted - 1) }}>
          <label>From usable row <input type="number" min={1} max={preview.total} value={start} onChange={(e) => setStart(e.target.value)} /></label>
          <button type="submit" className="button button--small" disabled={!valid}>Show</button>
        </form>
      </nav>
      {preview.rows.map((seq, i) => (
        <article key={i} className="sample" aria-label={`${unit} ${seq.line} ${seq.sequence}`}>
          <header className="sample__header small muted">
            {unit} {seq.line}{seq.sequence !== 'completion' && seq.sequence !== 'text' ? ` · ${seq.sequence}` : ''} · {seq.tokens} tokens, {seq.trained_tokens} trained
            {seq.refused && <span className="warning-text"> · the chat template refuses it (a job leaves it out): {seq.refused}</span>}
            {seq.truncated && (splitsLongRows
              ? <span> · longer than the max length: trained in rows of it (the first shown)</span>
              : <span className="warning-text"> · cut at the max length</span>)}
          </header>
          <pre className="sample__text">
            {seq.segments.map((s, j) => (s.trained ? <mark key={j} className="trained">{s.text}</mark> : <span key={j}>{s.text}</span>))}
          </pre>
        </article>
      ))}
    </section>
  )
}
