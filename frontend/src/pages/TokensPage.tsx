import { useCallback, useEffect, useState, type FormEvent } from 'react'
import { deleteJson, getJson, postJson } from '../api'
import { ErrorNotice, errorText, Field } from '../components/Field'
import { PageHeader } from '../components/PageHeader'
import { formatTime } from '../format'
import type { ApiToken, CreatedToken } from '../types'

/** API tokens for scripts: created (the secret is shown once), listed, revoked. */
export function TokensPage() {
  const [tokens, setTokens] = useState<ApiToken[] | null>(null)
  const [loadError, setLoadError] = useState<string | null>(null)
  const [name, setName] = useState('')
  const [nameError, setNameError] = useState<string | null>(null)
  const [created, setCreated] = useState<CreatedToken | null>(null)
  const [actionError, setActionError] = useState<string | null>(null)
  const [busy, setBusy] = useState(false)
  const [copied, setCopied] = useState(false)

  const load = useCallback(async () => {
    try {
      setTokens(await getJson<ApiToken[]>('/api/tokens'))
      setLoadError(null)
    } catch (err) {
      setLoadError(errorText(err))
    }
  }, [])

  useEffect(() => {
    void load()
  }, [load])

  async function create(event: FormEvent) {
    event.preventDefault()
    if (!name.trim()) {
      setNameError('Name the token after what will use it, e.g. "CI" or "laptop script".')
      return
    }
    setBusy(true)
    setActionError(null)
    try {
      const token = await postJson<CreatedToken>('/api/tokens', { name: name.trim() })
      setCreated(token)
      setCopied(false)
      setName('')
      await load()
    } catch (err) {
      setActionError(errorText(err))
    } finally {
      setBusy(false)
    }
  }

  async function revoke(token: ApiToken) {
    if (!window.confirm(`Revoke the token "${token.name}"? Scripts using it stop working at once.`)) return
    setActionError(null)
    try {
      await deleteJson(`/api/tokens/${token.id}`)
      if (created?.id === token.id) setCreated(null)
      await load()
    } catch (err) {
      setActionError(errorText(err))
    }
  }

  async function copy(text: string) {
    try {
      await navigator.clipboard.writeText(text)
      setCopied(true)
    } catch {
      setCopied(false)
    }
  }

  return (
    <>
      <PageHeader
        title="API tokens"
        description={
          <>
            Tokens let scripts use the API as you: send <code>Authorization: Bearer &lt;token&gt;</code>.
          </>
        }
      />
      <form className="panel" onSubmit={create} noValidate aria-label="Create a token">
        <div className="panel__body form__row">
          <Field label="Token name" error={nameError} help="What will use it; only you see your tokens.">
            <input
              type="text"
              value={name}
              maxLength={200}
              onChange={(e) => {
                setName(e.target.value)
                setNameError(null)
              }}
            />
          </Field>
          <button type="submit" className="button button--primary" disabled={busy}>
            {busy ? 'Creating…' : 'Create token'}
          </button>
        </div>
      </form>
      {created && (
        <div className="notice notice--ok" role="status" data-testid="new-token">
          <p className="notice__title">Token “{created.name}” created. Copy it now: it is not shown again.</p>
          <p className="token-secret">
            <code>{created.token}</code>
            <button type="button" className="button button--small" onClick={() => void copy(created.token)}>
              {copied ? 'Copied' : 'Copy'}
            </button>
          </p>
        </div>
      )}
      <ErrorNotice error={actionError} />
      <section className="panel" aria-labelledby="tokens-heading">
        <header className="panel__header">
          <h2 id="tokens-heading">Your tokens</h2>
        </header>
        <div className="panel__body">
          {loadError && <p className="error-text">Could not load your tokens: {loadError}</p>}
          {!tokens && !loadError && <p className="muted">Loading…</p>}
          {tokens && tokens.length === 0 && <p className="muted">No tokens yet.</p>}
          {tokens && tokens.length > 0 && (
            <table className="table">
              <thead>
                <tr>
                  <th scope="col">Name</th>
                  <th scope="col">Starts with</th>
                  <th scope="col">Created</th>
                  <th scope="col">Last used</th>
                  <th scope="col">State</th>
                  <th scope="col"><span className="visually-hidden">Actions</span></th>
                </tr>
              </thead>
              <tbody>
                {tokens.map((token) => (
                  <tr key={token.id}>
                    <td>{token.name}</td>
                    <td className="mono">{token.prefix}…</td>
                    <td className="nowrap">{formatTime(token.created_at)}</td>
                    <td className="nowrap">{token.last_used_at ? formatTime(token.last_used_at) : 'never'}</td>
                    <td>{token.revoked_at ? <span className="badge badge--muted">revoked</span> : <span className="badge badge--ok">active</span>}</td>
                    <td className="num">
                      {!token.revoked_at && (
                        <button type="button" className="button button--small button--danger" onClick={() => void revoke(token)}>
                          Revoke<span className="visually-hidden"> {token.name}</span>
                        </button>
                      )}
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          )}
        </div>
      </section>
    </>
  )
}
