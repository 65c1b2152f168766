import { useCallback } from 'react'
import { NavLink, Outlet, useNavigate } from 'react-router'
import { useAuth } from '../auth'
import { useJobNotifications } from '../notifications'
import { AppHeader } from './AppHeader'

interface NavItem {
  to: string
  label: string
  /** Match the path exactly (otherwise "/" would be active everywhere). */
  end?: boolean
}

export const NAV_ITEMS: NavItem[] = [
  { to: '/', label: 'Queue', end: true },
  { to: '/jobs/new', label: 'New fine-tune' },
  { to: '/datasets', label: 'Datasets' },
  { to: '/models', label: 'Models' },
  { to: '/artifacts', label: 'Artifacts' },
  { to: '/compare', label: 'Compare' },
  { to: '/playground', label: 'Playground' },
]

function SkipLink() {
  return (
    <a className="skip-link" href="#main">
      Skip to content
    </a>
  )
}

/** The page itself once the session is known; a short note while it is checked. */
function SignedInOutlet() {
  const auth = useAuth()
  if (auth.status === 'signed-in') return <Outlet />
  if (auth.status === 'error') {
    return (
      <div className="notice notice--error" role="alert">
        <p>Cannot reach the Lanner server: {auth.error}</p>
        <button type="button" className="button" onClick={auth.recheck}>
          Try again
        </button>
      </div>
    )
  }
  return <p className="muted">Checking your session…</p>
}

/** The frame of every signed-in page: header on top, navigation on the left. */
export function Layout() {
  const { user } = useAuth()
  const navigate = useNavigate()
  useJobNotifications(user, useCallback((path: string) => void navigate(path), [navigate]))
  return (
    <div className="app">
      <SkipLink />
      <AppHeader />
      <div className="app-body">
        <nav className="sidebar" aria-label="Main">
          <ul>
            {NAV_ITEMS.map((item) => (
              <li key={item.to}>
                <NavLink to={item.to} end={item.end} className="nav-link">
                  {item.label}
                </NavLink>
              </li>
            ))}
          </ul>
        </nav>
        <main id="main" className="content" tabIndex={-1}>
          <SignedInOutlet />
        </main>
      </div>
    </div>
  )
}

/** Pages shown before anyone is signed in (first-run setup, sign-in): no navigation. */
export function BareLayout() {
  return (
    <div className="app">
      <SkipLink />
      <AppHeader />
      <main id="main" className="content content--narrow" tabIndex={-1}>
        <Outlet />
      </main>
    </div>
  )
}
