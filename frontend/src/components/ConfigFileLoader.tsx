import { useState } from 'react'
import { postJson } from '../api'
import { errorText } from './Field'
import type { ParsedConfig } from '../types'

/** A YAML file (picked or pasted) read by the API as a spec: a job's downloaded YAML, or an Axolotl or
 * LLaMA-Factory training config. The page fills its form from what comes back. */
export function ConfigFileLoader({ onLoaded }: { onLoaded: (parsed: ParsedConfig) => void }) {
  const [text, setText] = useState('')
  const [busy, setBusy] = useState(false)
  const [error, setError] = useState<string | null>(null)
  const [parsed, setParsed] = useState<ParsedConfig | null>(null)

  async function read(content: string) {
    setBusy(true)
    setError(null)
    try {
      const result = await postJson<ParsedConfig>('/api/jobs/config/parse', { text: content })
      setParsed(result)
      onLoaded(result)
    } catch (err) {
      setParsed(null)
      setError(errorText(err))
    } finally {
      setBusy(false)
    }
  }

  return (
    <details className="panel config-loader" aria-label="Load a config file">
      <summary className="panel__header"><h2>Load a config file (YAML)</h2></summary>
      <div className="panel__body form__body">
        <p className="field__help">A job’s “Download YAML”, or an Axolotl or LLaMA-Factory training config: the fields that map fill the form below.</p>
        <label className="field__label" htmlFor="config-file">File</label>
        <input id="config-file" type="file" accept=".yaml,.yml,text/yaml" disabled={busy}
          onChange={(event) => { const file = event.target.files?.[0]; if (file) void file.text().then(read) }} />
        <label className="field__label" htmlFor="config-text">Or paste it</label>
        <textarea id="config-text" rows={6} value={text} onChange={(event) => setText(event.target.value)} spellCheck={false} />
        <div><button type="button" className="button" disabled={busy || !text.trim()} onClick={() => void read(text)}>Read</button></div>
        {error && <p className="error-text" role="alert">{error}</p>}
        {parsed && (
          <div role="status" data-testid="config-loaded">
            <p>Read as a {parsed.source} config{parsed.valid ? '.' : ': some fields need fixing (marked below).'}</p>
            {parsed.notes.map((note) => <p key={note} className="notice">{note}</p>)}
            {parsed.unmapped.length > 0 && <p>Not mapped: {parsed.unmapped.join(', ')}</p>}
          </div>
        )}
      </div>
    </details>
  )
}
