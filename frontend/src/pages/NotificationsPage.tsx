import { useCallback, useEffect, useState, type FormEvent } from 'react'
import { Link } from 'react-router'
import { deleteJson, fieldErrors, getJson, postJson, putJson } from '../api'
import { ErrorNotice, errorText, Field } from '../components/Field'
import { PageHeader } from '../components/PageHeader'
import { formatTime } from '../format'
import {
  browserNotificationState,
  turnOffBrowserNotifications,
  turnOnBrowserNotifications,
  type BrowserNotificationState,
} from '../notifications'
import type { CreatedWebhook, Delivery, EmailNotifications, Webhook, WebhookEvent } from '../types'

const EVENTS: { name: WebhookEvent; label: string }[] = [
  { name: 'finished', label: 'Finished' },
  { name: 'failed', label: 'Failed' },
  { name: 'waiting', label: 'Waiting' },
]
/** How often the delivery logs are read again while the page is open. */
const REFRESH_MS = 3000

const BROWSER_STATES: Record<BrowserNotificationState, string> = {
  unsupported: 'This browser cannot show notifications.',
  denied: 'This browser blocks notifications from the studio: allow them in its site settings, then turn them on here.',
  off: 'Off in this browser.',
  on: 'On: a notification appears when one of your jobs finishes, fails or is cancelled while the studio is open.',
}

function BrowserNotificationsPanel() {
  const [state, setState] = useState<BrowserNotificationState>(() => browserNotificationState())
  return (
    <section className="panel" aria-labelledby="browser-heading">
      <header className="panel__header">
        <h2 id="browser-heading">Browser notifications</h2>
      </header>
      <div className="panel__body">
        <p data-testid="browser-notifications-state">{BROWSER_STATES[state]}</p>
        {(state === 'off' || state === 'denied') && (
          <button type="button" className="button" onClick={() => void turnOnBrowserNotifications().then(setState)}>
            Turn on browser notifications
          </button>
        )}
        {state === 'on' && (
          <button type="button" className="button" onClick={() => setState(turnOffBrowserNotifications())}>
            Turn off
          </button>
        )}
      </div>
    </section>
  )
}

function EmailPanel() {
  const [email, setEmail] = useState<EmailNotifications | null>(null)
  const [error, setError] = useState<string | null>(null)

  useEffect(() => {
    getJson<EmailNotifications>('/api/me/notifications').then(setEmail, (err) => setError(errorText(err)))
  }, [])

  async function choose(enabled: boolean) {
    setError(null)
    try {
      setEmail(await putJson<EmailNotifications>('/api/me/notifications', { enabled }))
    } catch (err) {
      setError(fieldErrors(err).enabled ?? errorText(err))
    }
  }

  return (
    <section className="panel" aria-labelledby="email-heading">
      <header className="panel__header">
        <h2 id="email-heading">E-mail</h2>
      </header>
      <div className="panel__body">
        {!email && !error && <p className="muted">Loading…</p>}
        {email && (
          <label className="choice choice--inline">
            <input type="checkbox" checked={email.enabled} disabled={!email.available && !email.enabled}
              onChange={(e) => void choose(e.target.checked)} />
            <span className="choice__label">E-mail me at {email.address} when a job finishes, fails or waits</span>
            {!email.available && (
              <span className="choice__hint">No SMTP server is set up on this studio: an admin sets LANNER_SMTP_HOST.</span>
            )}
          </label>
        )}
        {error && <p className="error-text" role="alert">{error}</p>}
      </div>
    </section>
  )
}

function DeliveryLog({ webhook, refreshKey }: { webhook: Webhook; refreshKey: number }) {
  const [deliveries, setDeliveries] = useState<Delivery[] | null>(null)
  const [error, setError] = useState<string | null>(null)

  useEffect(() => {
    getJson<Delivery[]>(`/api/webhooks/${webhook.id}/deliveries`).then(
      (rows) => {
        setDeliveries(rows)
        setError(null)
      },
      (err) => setError(errorText(err)),
    )
  }, [webhook.id, refreshKey])

  if (error) return <p className="error-text">Could not load the deliveries: {error}</p>
  if (!deliveries) return <p className="muted">Loading…</p>
  if (deliveries.length === 0) return <p className="muted">No deliveries yet.</p>
  return (
    <table className="table" data-testid={`deliveries-${webhook.id}`}>
      <thead>
        <tr>
          <th scope="col">Event</th>
          <th scope="col">Job</th>
          <th scope="col">State</th>
          <th scope="col" className="num">Attempts</th>
          <th scope="col">Answer</th>
          <th scope="col">When</th>
        </tr>
      </thead>
      <tbody>
        {deliveries.map((delivery) => (
          <tr key={delivery.id}>
            <td>{delivery.event}</td>
            <td>{delivery.job_id ? <Link to={`/jobs/${delivery.job_id}`}>#{delivery.job_id}</Link> : '—'}</td>
            <td>
              <span className={`badge badge--${delivery.state === 'delivered' ? 'ok' : delivery.state === 'failed' ? 'failed' : 'queued'}`}>
                {delivery.state}
              </span>
            </td>
            <td className="num">{delivery.attempts}</td>
            <td>{delivery.error ?? (delivery.status_code ? `HTTP ${delivery.status_code}` : '—')}</td>
            <td className="nowrap">
              {delivery.delivered_at
                ? formatTime(delivery.delivered_at)
                : delivery.next_try_at && delivery.state === 'pending'
                  ? `next try ${formatTime(delivery.next_try_at)}`
                  : formatTime(delivery.created_at)}
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  )
}

function WebhooksPanel() {
  const [webhooks, setWebhooks] = useState<Webhook[] | null>(null)
  const [loadError, setLoadError] = useState<string | null>(null)
  const [url, setUrl] = useState('')
  const [events, setEvents] = useState<WebhookEvent[]>(['finished', 'failed'])
  const [errors, setErrors] = useState<Record<string, string>>({})
  const [actionError, setActionError] = useState<string | null>(null)
  const [created, setCreated] = useState<CreatedWebhook | null>(null)
  const [busy, setBusy] = useState(false)
  const [refreshKey, setRefreshKey] = useState(0)

  const load = useCallback(async () => {
    try {
      setWebhooks(await getJson<Webhook[]>('/api/webhooks'))
      setLoadError(null)
    } catch (err) {
      setLoadError(errorText(err))
    }
  }, [])

  useEffect(() => {
    void load()
    const timer = setInterval(() => setRefreshKey((k) => k + 1), REFRESH_MS)
    return () => clearInterval(timer)
  }, [load])

  async function create(event: FormEvent) {
    event.preventDefault()
    setBusy(true)
    setErrors({})
    setActionError(null)
    try {
      setCreated(await postJson<CreatedWebhook>('/api/webhooks', { url: url.trim(), events }))
      setUrl('')
      await load()
    } catch (err) {
      const byField = fieldErrors(err)
      if (Object.keys(byField).length > 0) setErrors(byField)
      else setActionError(errorText(err))
    } finally {
      setBusy(false)
    }
  }

  async function act(action: () => Promise<unknown>) {
    setActionError(null)
    try {
      await action()
      await load()
      setRefreshKey((k) => k + 1)
    } catch (err) {
      setActionError(errorText(err))
    }
  }

  function remove(webhook: Webhook) {
    if (!window.confirm(`Delete the webhook to ${webhook.url}? Its delivery log goes with it.`)) return
    void act(async () => {
      await deleteJson(`/api/webhooks/${webhook.id}`)
      if (created?.id === webhook.id) setCreated(null)
    })
  }

  return (
    <>
      <form className="panel" onSubmit={create} noValidate aria-label="Add a webhook">
        <header className="panel__header">
          <h2>Webhooks</h2>
        </header>
        <div className="panel__body">
          <Field label="URL" error={errors.url} help="The studio POSTs a signed JSON body to it (docs/notifications.md).">
            <input type="url" value={url} maxLength={2048} placeholder="https://example.com/lanner-hook"
              onChange={(e) => setUrl(e.target.value)} />
          </Field>
          <fieldset className="choices">
            <legend>Events</legend>
            {EVENTS.map((option) => (
              <label key={option.name} className="choice choice--inline">
                <input type="checkbox" checked={events.includes(option.name)}
                  onChange={(e) => setEvents((chosen) => e.target.checked
                    ? EVENTS.map((o) => o.name).filter((n) => n === option.name || chosen.includes(n))
                    : chosen.filter((n) => n !== option.name))} />
                <span className="choice__label">{option.label}</span>
              </label>
            ))}
            {errors.events && <p className="error-text" role="alert">{errors.events}</p>}
          </fieldset>
          <button type="submit" className="button button--primary" disabled={busy}>
            {busy ? 'Adding…' : 'Add webhook'}
          </button>
        </div>
      </form>
      {created && (
        <div className="notice notice--ok" role="status" data-testid="new-webhook">
          <p className="notice__title">Webhook added. Its signing secret, shown this once:</p>
          <p className="token-secret"><code>{created.secret}</code></p>
          <p className="small">
            Each POST carries <code>X-Lanner-Signature: sha256=&lt;HMAC-SHA256 of the body with this secret&gt;</code>{' '}
            and <code>X-Lanner-Timestamp</code>.
          </p>
        </div>
      )}
      <ErrorNotice error={actionError} />
      {loadError && <p className="error-text">Could not load your webhooks: {loadError}</p>}
      {webhooks && webhooks.length === 0 && <p className="muted">No webhooks yet.</p>}
      {webhooks?.map((webhook) => (
        <section key={webhook.id} className="panel" aria-label={`Webhook ${webhook.url}`}>
          <header className="panel__header">
            <h3 className="mono">{webhook.url}</h3>
            <span className="muted small">{webhook.events.join(', ')}</span>
            <button type="button" className="button button--small"
              onClick={() => void act(() => postJson(`/api/webhooks/${webhook.id}/test`, {}))}>
              Send test
            </button>
            <button type="button" className="button button--small button--danger" onClick={() => remove(webhook)}>
              Delete
            </button>
          </header>
          <div className="panel__body">
            <DeliveryLog webhook={webhook} refreshKey={refreshKey} />
          </div>
        </section>
      ))}
    </>
  )
}

/** The signed-in user's notifications: this browser's, e-mail, and webhooks with their delivery logs. */
export function NotificationsPage() {
  return (
    <>
      <PageHeader title="Notifications" description="Hear when your jobs finish, fail or wait for a machine." />
      <BrowserNotificationsPanel />
      <EmailPanel />
      <WebhooksPanel />
    </>
  )
}
