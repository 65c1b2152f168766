import { createContext, useContext } from 'react'
import type { User } from './types'

export type AuthStatus = 'loading' | 'setup' | 'signed-out' | 'signed-in' | 'error'

export interface AuthState {
  status: AuthStatus
  user: User | null
  /** Why the session could not be checked (backend unreachable…). */
  error: string | null
  /** After setup or sign-in: the user the server answered with. */
  signedIn: (user: User) => void
  signOut: () => Promise<void>
  /** Check again (after an error). */
  recheck: () => void
}

export const AuthContext = createContext<AuthState>({
  status: 'loading',
  user: null,
  error: null,
  signedIn: () => {},
  signOut: async () => {},
  recheck: () => {},
})

export function useAuth(): AuthState {
  return useContext(AuthContext)
}

/** Members act on their own jobs and datasets; admins on everyone's (as the API enforces). */
export function mayManage(user: User | null, ownerId: number): boolean {
  return !!user && (user.role === 'admin' || user.id === ownerId)
}
