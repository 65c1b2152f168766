import { useState, type FormEvent } from 'react'
import { useNavigate, useSearchParams } from 'react-router'
import { ApiError, postJson } from '../api'
import { useAuth } from '../auth'
import { ErrorNotice, errorText, Field } from '../components/Field'
import { PageHeader } from '../components/PageHeader'
import type { User } from '../types'

/** Only paths inside the app: never follow ?next= off-site. */
export function safeNext(next: string | null): string {
  return next && next.startsWith('/') && !next.startsWith('//') ? next : '/'
}

export function SignInPage() {
  const navigate = useNavigate()
  const [params] = useSearchParams()
  const auth = useAuth()
  const [email, setEmail] = useState('')
  const [password, setPassword] = useState('')
  const [error, setError] = useState<string | null>(null)
  const [busy, setBusy] = useState(false)

  async function submit(event: FormEvent) {
    event.preventDefault()
    if (!email.trim() || !password) {
      setError('Enter your email and password.')
      return
    }
    setBusy(true)
    setError(null)
    try {
      const user = await postJson<User>('/api/auth/sign-in', { email: email.trim(), password })
      auth.signedIn(user)
      navigate(safeNext(params.get('next')), { replace: true })
    } catch (err) {
      setError(err instanceof ApiError && err.status === 401 ? 'Wrong email or password.' : errorText(err))
    } finally {
      setBusy(false)
    }
  }

  return (
    <>
      <PageHeader title="Sign in" description="Sign in with the account your Lanner administrator created." />
      <form className="panel form" onSubmit={submit} noValidate aria-label="Sign in">
        <div className="panel__body form__body">
          <Field label="Email">
            <input type="email" autoComplete="username" value={email} onChange={(e) => setEmail(e.target.value)} />
          </Field>
          <Field label="Password">
            <input type="password" autoComplete="current-password" value={password} onChange={(e) => setPassword(e.target.value)} />
          </Field>
          <ErrorNotice error={error} />
          <div className="form__actions">
            <button type="submit" className="button button--primary" disabled={busy}>
              {busy ? 'Signing in…' : 'Sign in'}
            </button>
          </div>
          <p className="muted small">Jobs, datasets and artifacts are shared by the team on this box.</p>
        </div>
      </form>
    </>
  )
}
