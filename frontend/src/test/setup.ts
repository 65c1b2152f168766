import '@testing-library/jest-dom/vitest'
import { cleanup, configure } from '@testing-library/react'
import { afterEach } from 'vitest'

// Vitest globals are off, so Testing Library cannot register its own cleanup.
afterEach(() => {
  cleanup()
})

// findBy… waits up to 1 s by default, too short when the machine is busy (the suite runs beside
// training and browser tests); a real failure still fails, only later.
configure({ asyncUtilTimeout: 10_000 })
