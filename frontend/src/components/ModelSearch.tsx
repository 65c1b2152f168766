import { useState, type FormEvent } from 'react'
import { ApiError, getJson } from '../api'
import type { HubModel } from '../types'
import { errorText } from './Field'

/**
 * Searches the model hub through the server (GET /api/models/search). When the server cannot reach
 * the hub it answers 503 "offline"; that is said plainly, with what to use instead.
 */
export function ModelSearch({ chosen, onChoose }: { chosen: string; onChoose: (id: string) => void }) {
  const [query, setQuery] = useState('')
  const [results, setResults] = useState<HubModel[] | null>(null)
  const [offline, setOffline] = useState<string | null>(null)
  const [error, setError] = useState<string | null>(null)
  const [busy, setBusy] = useState(false)

  async function search(event: FormEvent) {
    event.preventDefault()
    event.stopPropagation()
    const q = query.trim()
    if (!q) return
    setBusy(true)
    setError(null)
    try {
      setResults(await getJson<HubModel[]>(`/api/models/search?${new URLSearchParams({ q, limit: '20' })}`))
      setOffline(null)
    } catch (err) {
      setResults(null)
      if (err instanceof ApiError && err.status === 503) setOffline(err.message)
      else setError(errorText(err))
    } finally {
      setBusy(false)
    }
  }

  return (
    <div className="model-search" data-testid="model-search">
      {/* A div, not a nested form: Enter in the box searches instead of submitting the job form. */}
      <div className="model-search__bar" role="search">
        <label htmlFor="hub-query" className="visually-hidden">Search the model hub</label>
        <input id="hub-query" type="search" value={query} placeholder="Search the hub, e.g. qwen 0.5b instruct"
          onChange={(e) => setQuery(e.target.value)} onKeyDown={(e) => { if (e.key === 'Enter') void search(e) }} />
        <button type="button" className="button" disabled={busy || !query.trim()} onClick={(e) => void search(e)}>
          {busy ? 'Searching…' : 'Search'}
        </button>
      </div>
      {offline && (
        <div className="notice notice--warning" role="status" data-testid="hub-offline">
          <p className="notice__title">Offline: this server cannot reach the model hub.</p>
          <p className="small">{offline}</p>
        </div>
      )}
      {error && <p className="error-text" role="alert">Search failed: {error}</p>}
      {results && results.length === 0 && <p className="muted">No text-generation model matches “{query}”.</p>}
      {results && results.length > 0 && (
        <ul className="model-search__results" aria-label="Hub models">
          {results.map((m) => (
            <li key={m.id}>
              <label className={`choice choice--inline${chosen === m.id ? ' choice--selected' : ''}`}>
                <input type="radio" name="hub-model" value={m.id} checked={chosen === m.id} onChange={() => onChoose(m.id)} />
                <span className="choice__label mono">{m.id}</span>
                <span className="choice__hint">{m.downloads != null ? `${m.downloads.toLocaleString('en-US')} downloads` : ''}{m.likes != null ? ` · ${m.likes} likes` : ''}</span>
              </label>
            </li>
          ))}
        </ul>
      )}
    </div>
  )
}
