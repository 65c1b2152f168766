import { useCallback, useEffect, useMemo, useRef, useState, type ReactNode } from 'react'
import { useLocation, useNavigate } from 'react-router'
import { ApiError, getJson, postJson, UNAUTHORIZED_EVENT } from '../api'
import { AuthContext, type AuthState, type AuthStatus } from '../auth'
import type { SetupState, User } from '../types'

const PUBLIC_PATHS = ['/setup', '/signin']

/**
 * Knows who is signed in. On start it asks whether first-run setup is needed (then sends the
 * browser to /setup), else who the session belongs to (else to /signin?next=…). Any 401 from the
 * API later sends the browser to sign-in again, back to where it was afterwards.
 */
export function AuthProvider({ children }: { children: ReactNode }) {
  const navigate = useNavigate()
  const location = useLocation()
  const [status, setStatus] = useState<AuthStatus>('loading')
  const [user, setUser] = useState<User | null>(null)
  const [error, setError] = useState<string | null>(null)
  const [attempt, setAttempt] = useState(0)
  const here = useRef(location)
  here.current = location

  const toSignIn = useCallback(() => {
    const { pathname, search } = here.current
    if (PUBLIC_PATHS.includes(pathname)) return
    const next = pathname === '/' ? '' : `?next=${encodeURIComponent(pathname + search)}`
    navigate(`/signin${next}`, { replace: true })
  }, [navigate])

  useEffect(() => {
    const controller = new AbortController()
    async function check() {
      try {
        const setup = await getJson<SetupState>('/api/setup', controller.signal)
        if (setup.needed) {
          setStatus('setup')
          setUser(null)
          if (here.current.pathname !== '/setup') navigate('/setup', { replace: true })
          return
        }
        const me = await getJson<User>('/api/me', controller.signal)
        setUser(me)
        setStatus('signed-in')
        setError(null)
      } catch (err) {
        if (controller.signal.aborted) return
        if (err instanceof ApiError && err.status === 401) {
          setUser(null)
          setStatus('signed-out')
          toSignIn()
          return
        }
        setStatus('error')
        setError(err instanceof Error ? err.message : String(err))
      }
    }
    void check()
    return () => controller.abort()
  }, [attempt, navigate, toSignIn])

  useEffect(() => {
    function onUnauthorized() {
      setUser(null)
      setStatus('signed-out')
      toSignIn()
    }
    window.addEventListener(UNAUTHORIZED_EVENT, onUnauthorized)
    return () => window.removeEventListener(UNAUTHORIZED_EVENT, onUnauthorized)
  }, [toSignIn])

  const signedIn = useCallback((next: User) => {
    setUser(next)
    setStatus('signed-in')
    setError(null)
  }, [])

  const signOut = useCallback(async () => {
    try {
      await postJson('/api/auth/sign-out', {})
    } finally {
      setUser(null)
      setStatus('signed-out')
      navigate('/signin', { replace: true })
    }
  }, [navigate])

  const recheck = useCallback(() => {
    setStatus('loading')
    setAttempt((n) => n + 1)
  }, [])

  const value = useMemo<AuthState>(
    () => ({ status, user, error, signedIn, signOut, recheck }),
    [status, user, error, signedIn, signOut, recheck],
  )
  return <AuthContext.Provider value={value}>{children}</AuthContext.Provider>
}
