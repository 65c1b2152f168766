import { useEffect, useMemo, useState } from 'react'
import { ApiError, getJson } from '../api'
import { lengthHistogram } from '../tokenHistogram'
import type { Dataset, DatasetPreview, TokenStats } from '../types'
import { errorText } from './Field'

const DEBOUNCE_MS = 400
const PREVIEW_ROWS = 3

interface Props {
  dataset: Dataset
  model: string
  maxSeqLen: number | null
}

/**
 * What the model will learn from a dataset with these settings: a few rows rendered through the
 * model's chat template with the trained tokens highlighted, and the token lengths as a histogram
 * with the rows the max sequence length would cut.
 */
export function DatasetInsights({ dataset, model, maxSeqLen }: Props) {
  const [preview, setPreview] = useState<DatasetPreview | null>(null)
  const [stats, setStats] = useState<TokenStats | null>(null)
  const [error, setError] = useState<string | null>(null)
  const [unavailable, setUnavailable] = useState<string | null>(null)
  const length = maxSeqLen && maxSeqLen >= 16 ? maxSeqLen : null

  useEffect(() => {
    if (!model || !length) return
    const abort = new AbortController()
    const query = new URLSearchParams({ model, max_seq_len: String(length) })
    const failed = (err: unknown) => {
      if (abort.signal.aborted) return
      if (err instanceof ApiError && err.status === 409) setUnavailable(err.message)
      else setError(errorText(err))
    }
    // One after the other: the first request loads the tokenizer into the API process, and the
    // second then finds it loaded (two first loads at once can trip over each other there).
    const timer = setTimeout(async () => {
      try {
        setPreview(await getJson<DatasetPreview>(`/api/datasets/${dataset.id}/preview?${query}&rows=${PREVIEW_ROWS}`, abort.signal))
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
      clearTimeout(timer)
    }
  }, [dataset.id, model, length])

  return (
    <div className="insights" data-testid="dataset-insights">
      {unavailable && (
        <p className="notice" role="status">The preview needs {model}’s tokenizer on the server: {unavailable}</p>
      )}
      {error && <p className="error-text">Could not render the preview: {error}</p>}
      {!preview && !unavailable && !error && <p className="muted small">Rendering the first rows through the model’s chat template…</p>}
      {stats && length && <LengthHistogramView stats={stats} maxSeqLen={length} />}
      {preview && <PreviewView preview={preview} />}
    </div>
  )
}

function LengthHistogramView({ stats, maxSeqLen }: { stats: TokenStats; maxSeqLen: number }) {
  const histogram = useMemo(() => (stats.lengths ? lengthHistogram(stats.lengths, maxSeqLen) : null), [stats.lengths, maxSeqLen])
  const truncated = histogram ? histogram.truncated : (stats.over_max_seq_len ?? 0)
  const sequences = stats.sequences
  const unit = stats.task === 'preference' ? 'sequences (each pair is two)' : 'rows'
  return (
    <section className="report" aria-label="Token lengths" data-testid="token-stats">
      <h3 className="report__title">Token lengths</h3>
      <p data-testid="truncation" className={truncated > 0 ? 'warning-text' : undefined}>
        {truncated > 0
          ? `${truncated} of ${sequences} ${unit} are longer than ${maxSeqLen} tokens and would be cut.`
          : `All ${sequences} ${unit} fit in ${maxSeqLen} tokens.`}
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
            <span>tokens per {stats.task === 'preference' ? 'sequence' : 'row'} · <span className="histogram__legend-cut">■</span> cut at {maxSeqLen}</span>
            <span>{histogram.bins.at(-1)!.to - 1}</span>
          </figcaption>
        </figure>
      )}
    </section>
  )
}

function PreviewView({ preview }: { preview: DatasetPreview }) {
  return (
    <section className="report" aria-label="Rendered samples" data-testid="dataset-preview">
      <h3 className="report__title">How the model sees the first rows</h3>
      <p className="muted small">
        Rendered with {preview.model}’s chat template. <mark className="trained">Highlighted</mark> tokens are trained on (the loss is
        computed there); the rest is context.
      </p>
      {preview.rows.map((seq, i) => (
        <article key={i} className="sample" aria-label={`Row ${seq.row} ${seq.sequence}`}>
          <header className="sample__header small muted">
            Row {seq.row}{seq.sequence !== 'completion' && seq.sequence !== 'text' ? ` · ${seq.sequence}` : ''} · {seq.tokens} tokens, {seq.trained_tokens} trained
            {seq.truncated && <span className="warning-text"> · cut at the max length</span>}
          </header>
          <pre className="sample__text">
            {seq.segments.map((s, j) => (s.trained ? <mark key={j} className="trained">{s.text}</mark> : <span key={j}>{s.text}</span>))}
          </pre>
        </article>
      ))}
    </section>
  )
}
