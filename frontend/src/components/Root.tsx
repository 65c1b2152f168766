import { Outlet } from 'react-router'
import { AuthProvider } from './AuthProvider'
import { HealthProvider } from './HealthProvider'

/** Top of the route tree: app-wide state that outlives page changes. */
export function Root() {
  return (
    <HealthProvider>
      <AuthProvider>
        <Outlet />
      </AuthProvider>
    </HealthProvider>
  )
}
