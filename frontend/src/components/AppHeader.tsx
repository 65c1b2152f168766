import { Link } from 'react-router'
import { useHealth } from '../health'
import { AccountMenu } from './AccountMenu'
import { StatusIndicator } from './StatusIndicator'

export function AppHeader() {
  const state = useHealth()
  return (
    <header className="app-header">
      <Link to="/" className="brand" aria-label="Lanner — queue">
        <svg className="brand__mark" viewBox="0 0 32 32" aria-hidden="true">
          <path d="M10 7v18h13" fill="none" stroke="currentColor" strokeWidth="4" strokeLinecap="round" strokeLinejoin="round" />
        </svg>
        <span className="brand__name">Lanner</span>
      </Link>
      {state.health && <span className="app-header__version">v{state.health.version}</span>}
      <div className="app-header__spacer" />
      <StatusIndicator state={state} />
      <AccountMenu />
    </header>
  )
}
