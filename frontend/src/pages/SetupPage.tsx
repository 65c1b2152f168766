import { useState, type FormEvent } from 'react'
import { useNavigate } from 'react-router'
import { ApiError, fieldErrors, postJson } from '../api'
import { useAuth } from '../auth'
import { ErrorNotice, errorText, Field } from '../components/Field'
import { PageHeader } from '../components/PageHeader'
import type { User } from '../types'

export const MIN_PASSWORD_LENGTH = 8

export interface AccountForm {
  email: string
  display_name: string
  password: string
  confirm: string
}

/** Problems the server would also find, caught before sending. */
export function validateAccount(form: AccountForm): Partial<Record<keyof AccountForm, string>> {
  const errors: Partial<Record<keyof AccountForm, string>> = {}
  const email = form.email.trim()
  const [local, domain] = email.split('@')
  if (!email) errors.email = 'Enter an email address.'
  else if (!local || !domain || /\s/.test(email)) errors.email = 'Enter an email address like ada@example.com.'
  if (!form.display_name.trim()) errors.display_name = 'Enter the name your team will see.'
  if (form.password.length < MIN_PASSWORD_LENGTH)
    errors.password = `Use at least ${MIN_PASSWORD_LENGTH} characters.`
  if (form.confirm !== form.password) errors.confirm = 'The two passwords differ.'
  return errors
}

export function SetupPage() {
  const navigate = useNavigate()
  const auth = useAuth()
  const [form, setForm] = useState<AccountForm>({ email: '', display_name: '', password: '', confirm: '' })
  const [touched, setTouched] = useState(false)
  const [serverErrors, setServerErrors] = useState<Record<string, string>>({})
  const [error, setError] = useState<string | null>(null)
  const [busy, setBusy] = useState(false)
  const errors = touched ? validateAccount(form) : {}

  function set<K extends keyof AccountForm>(key: K, value: string) {
    setForm((f) => ({ ...f, [key]: value }))
    setServerErrors((e) => ({ ...e, [key]: '' }))
  }

  async function submit(event: FormEvent) {
    event.preventDefault()
    setTouched(true)
    if (Object.keys(validateAccount(form)).length > 0) return
    setBusy(true)
    setError(null)
    try {
      const user = await postJson<User>('/api/setup', {
        email: form.email.trim(),
        display_name: form.display_name.trim(),
        password: form.password,
      })
      auth.signedIn(user)
      navigate('/', { replace: true })
    } catch (err) {
      if (err instanceof ApiError && err.status === 409) {
        setError('Setup is already done on this server. Sign in with your account instead.')
      } else if (err instanceof ApiError && err.status === 422) {
        setServerErrors(fieldErrors(err))
      } else setError(errorText(err))
    } finally {
      setBusy(false)
    }
  }

  return (
    <>
      <PageHeader
        title="Set up Lanner"
        description="First run: create the administrator account that manages users, workers and storage."
      />
      <form className="panel form" onSubmit={submit} noValidate aria-label="Create the administrator">
        <div className="panel__body form__body">
          <Field label="Email" error={errors.email ?? serverErrors.email} help="You sign in with it.">
            <input type="email" autoComplete="username" value={form.email} onChange={(e) => set('email', e.target.value)} />
          </Field>
          <Field label="Your name" error={errors.display_name ?? serverErrors.display_name} help="Shown next to your jobs in the queue.">
            <input type="text" autoComplete="name" value={form.display_name} onChange={(e) => set('display_name', e.target.value)} />
          </Field>
          <Field label="Password" error={errors.password ?? serverErrors.password} help={`At least ${MIN_PASSWORD_LENGTH} characters.`}>
            <input type="password" autoComplete="new-password" value={form.password} onChange={(e) => set('password', e.target.value)} />
          </Field>
          <Field label="Password again" error={errors.confirm}>
            <input type="password" autoComplete="new-password" value={form.confirm} onChange={(e) => set('confirm', e.target.value)} />
          </Field>
          <ErrorNotice error={error} />
          <div className="form__actions">
            <button type="submit" className="button button--primary" disabled={busy}>
              {busy ? 'Creating…' : 'Create administrator'}
            </button>
            {error && (
              <button type="button" className="button" onClick={() => navigate('/signin')}>
                Go to sign-in
              </button>
            )}
          </div>
          <p className="muted small">This page appears once, while no user exists. After setup, everyone signs in.</p>
        </div>
      </form>
    </>
  )
}
